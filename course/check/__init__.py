"""Exercise checkers, used by the notebooks' test cells and by the autograder.

    report = check.rmsnorm_forward(rmsnorm)   # AssertionError with advice on failure
    check.rmsnorm_forward_bandwidth(rmsnorm)  # GPU only: fraction of copy bandwidth

One checker (or two) per chapter exercise:

    01  torch_rmsnorm(rmsnorm_torch)
    02  ridge_point(ridge_point, regime),
        roofline_functions(fused_rmsnorm_bytes, rmsnorm_flops, arithmetic_intensity,
                           time_floor_us)
    03  eager_launch_bytes(fn), honest_timer(time_workload),
        rmsnorm_two_pass(fn), rmsnorm_two_pass_bandwidth(fn)          (the latter reports)
    04  rmsnorm_forward(fn), rmsnorm_forward_bandwidth(fn)
    05  add_rmsnorm(fn), add_rmsnorm_bandwidth(fn)
    06  layernorm_forward(fn), layernorm_forward_bandwidth(fn)
    07  row_dots(fn), split_rule(fn), rmsnorm_backward(fn, only=...),
        rmsnorm_backward_bandwidth(fn), layernorm_backward(fn, only=...),
        layernorm_backward_bandwidth(fn), rmsnorm_autograd(Function),
        rmsnorm_gradcheck(Function)
    08  launch_counted(launch_counted), launch_rule(choose_launch, fn),
        beats_torch_compile(fn)                                       (the latter GPU only)
"""

from course.check.add_rmsnorm import add_rmsnorm, add_rmsnorm_bandwidth
from course.check.autograd import rmsnorm_autograd
from course.check.backward import rmsnorm_backward, rmsnorm_backward_bandwidth
from course.check.bandwidth import BandwidthResult, check_bandwidth
from course.check.eager_bytes import eager_launch_bytes
from course.check.finite_differences import rmsnorm_gradcheck
from course.check.lab import CompileComparison, RuleReport, beats_torch_compile, launch_rule
from course.check.lab_timers import launch_counted
from course.check.layernorm import layernorm_forward, layernorm_forward_bandwidth
from course.check.layernorm_backward import layernorm_backward, layernorm_backward_bandwidth
from course.check.report import Report
from course.check.rmsnorm import rmsnorm_forward, rmsnorm_forward_bandwidth
from course.check.roofline import ridge_point, roofline_functions
from course.check.row_split import row_dots, split_rule
from course.check.timer import honest_timer
from course.check.torch_reference import torch_rmsnorm
from course.check.two_pass import ModelComparison, rmsnorm_two_pass, rmsnorm_two_pass_bandwidth

__all__ = ["BandwidthResult", "CompileComparison", "ModelComparison", "Report",
           "add_rmsnorm", "add_rmsnorm_bandwidth", "beats_torch_compile", "check_bandwidth",
           "eager_launch_bytes", "honest_timer", "launch_counted", "launch_rule", "RuleReport",
           "layernorm_backward", "layernorm_backward_bandwidth", "layernorm_forward",
           "layernorm_forward_bandwidth", "rmsnorm_autograd", "rmsnorm_backward",
           "rmsnorm_backward_bandwidth", "rmsnorm_forward", "rmsnorm_forward_bandwidth",
           "ridge_point", "rmsnorm_gradcheck", "rmsnorm_two_pass", "rmsnorm_two_pass_bandwidth",
           "roofline_functions", "row_dots", "split_rule", "torch_rmsnorm"]
