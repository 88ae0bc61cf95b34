"""Exercise checkers, used by the notebooks' test cells and by the autograder.

    report = check.rmsnorm_forward(rmsnorm)   # AssertionError with advice on failure
    check.rmsnorm_forward_bandwidth(rmsnorm)  # GPU only: fraction of copy bandwidth
"""

from course.check.bandwidth import BandwidthResult, check_bandwidth
from course.check.report import Report
from course.check.rmsnorm import rmsnorm_forward, rmsnorm_forward_bandwidth

__all__ = ["BandwidthResult", "Report", "check_bandwidth", "rmsnorm_forward",
           "rmsnorm_forward_bandwidth"]
