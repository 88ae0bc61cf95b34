"""The interactive calculators every chapter shows (ipywidgets 8 and matplotlib).

    from course import widgets
    widgets.traffic_calculator("fused_rmsnorm", fn=rmsnorm)   # bytes, launches, time
    widgets.roofline_explorer()                               # distance from the ridge
    widgets.reduction_visualiser()                            # tree versus warp shuffles

Each factory returns an object that shows itself when it is a cell's last line (or through
`display(obj)`), keeps the ipywidgets container in `.widget`, and exposes its controls and
computed numbers as attributes. Every number comes from `course.traffic` and
`course.hardware`.
"""

from course.widgets.reduction import ReductionVisualiser, reduction_schedule, reduction_visualiser
from course.widgets.roofline import RooflineExplorer, roofline_explorer
from course.widgets.traffic_calculator import VARIANTS, TrafficCalculator, traffic_calculator

__all__ = ["VARIANTS", "ReductionVisualiser", "RooflineExplorer", "TrafficCalculator",
           "reduction_schedule", "reduction_visualiser", "roofline_explorer",
           "traffic_calculator"]
