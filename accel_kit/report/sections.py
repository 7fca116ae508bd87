"""The report's sections in the page's order: one function per table or figure of the paper, each
``(ctx) -> Section``.

The sections live by concern: the framework (``Context``, ``Section``) in
``accel_kit.report.context``, pivots in ``pivot``, the cell helpers in ``cells``, the Systems
section in ``systems_section``, Tables II-IV in ``tables``, Figures 3-8 in ``figures`` and the
what-if section in ``what_if``, offline generation and serving in ``inference_section``, tune runs in
``tune_section``. ``SECTIONS`` is the
page's order: a new section is one more function appended there.
"""
from __future__ import annotations

from typing import Callable

from accel_kit.report.context import Context, Section
from accel_kit.report.figures import (figure_3_forward, figure_4_backward, figure_5_scaling, figure_6_gas,
                                      figure_7_sparsity_throughput, figure_8_sparsity_loss)
from accel_kit.report.inference_section import inference_section
from accel_kit.report.models_section import models_section
from accel_kit.report.systems_section import systems_section
from accel_kit.report.tables import table_ii_scaling, table_iii_seq_length, table_iv_genslm
from accel_kit.report.tune_section import tune_section
from accel_kit.report.what_if import what_if_held_out

# A section function may return None: a section with nothing to show where its records are absent (tune).
SECTIONS: list[Callable[[Context], Section | None]] = [
    systems_section,
    models_section,
    # findings are computed after the tables they summarise; the page shows them second (see build_report)
    table_ii_scaling,
    table_iii_seq_length,
    table_iv_genslm,
    figure_3_forward,
    figure_4_backward,
    figure_5_scaling,
    figure_6_gas,
    figure_7_sparsity_throughput,
    figure_8_sparsity_loss,
    inference_section,
    what_if_held_out,
    tune_section,
]
