"""Imports torchvision and timm where torchvision's C ops cannot load (a CUDA wheel beside a
CPU torch). torchvision/_meta_registrations.py registers fake kernels for torchvision::nms and
torchvision::qnms unconditionally at import, which fails when the extension did not define the
operators; defining their schemas first (in a Library kept alive at module level) gives those
registrations an operator to attach to. Models that call the C ops (nms, roi_align: detection)
still cannot run."""
import torch
lib = None
def define_torchvision_ops():
    """Makes `import torchvision` work here; transformers, peft and lightning import it too."""
    global lib
    if lib is None:
        try:
            torch.ops.torchvision.nms  # the extension loaded: nothing to do
        except (AttributeError, RuntimeError):
            lib = torch.library.Library("torchvision", "DEF")
            lib.define("nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
            lib.define("qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
def import_vision():
    define_torchvision_ops()
    import torchvision, timm
    return torchvision, timm
