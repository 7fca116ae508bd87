# JupyterLab's server settings for this project, loaded by `make lab` (JUPYTER_CONFIG_PATH=<the checkout>):
# a notebook git tracks is saved without outputs, in the form it is committed in, so saving it leaves
# `git status` clean (accel_kit.notebooks_meta.pre_save_hook says why this and not a git filter).
c = get_config()  # noqa: F821 (Jupyter's config loader defines it)
c.ContentsManager.pre_save_hook = "accel_kit.notebooks_meta.pre_save_hook"
