"""GPU time by kernel from a torch.profiler run (CUPTI: CUDA graph replays'
kernels included), for the benchmarks that print where a step's time goes."""
import torch


def kernel_times(prof):
    """{kernel name: [microseconds, launches]} over the profile's CUDA events."""
    kernels = {}
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            k = kernels.setdefault(e.name, [0.0, 0])
            k[0] += e.device_time_total if hasattr(e, "device_time_total") else e.cuda_time_total
            k[1] += 1
    return kernels
