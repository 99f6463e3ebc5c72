#include "convert.h"

namespace ddp::py {
namespace {

Status NeedParams(const OpSpec& s, size_t n) {
  if (s.second.size() != n) {
    return InvalidArgumentError("transform op '" + s.first + "' takes " + std::to_string(n) +
                                " parameters, got " + std::to_string(s.second.size()));
  }
  return Status::Ok();
}

// The engine's op for one (name, parameters) pair.
Result<image::TransformOp> MakeOp(const OpSpec& s) {
  image::TransformOp op;
  const std::vector<double>& p = s.second;
  if (s.first == "resize") {
    DDP_RETURN_IF_ERROR(NeedParams(s, 3));
    op.kind = image::OpKind::kResize;
    op.height = static_cast<int>(p[0]);
    op.width = static_cast<int>(p[1]);
    op.antialias = p[2] != 0;
  } else if (s.first == "center_crop") {
    DDP_RETURN_IF_ERROR(NeedParams(s, 2));
    op.kind = image::OpKind::kCenterCrop;
    op.height = static_cast<int>(p[0]);
    op.width = static_cast<int>(p[1]);
  } else if (s.first == "random_resized_crop") {
    DDP_RETURN_IF_ERROR(NeedParams(s, 7));
    op.kind = image::OpKind::kRandomResizedCrop;
    op.height = static_cast<int>(p[0]);
    op.width = static_cast<int>(p[1]);
    op.scale = {p[2], p[3]};
    op.ratio = {p[4], p[5]};
    op.antialias = p[6] != 0;
  } else if (s.first == "hflip") {
    DDP_RETURN_IF_ERROR(NeedParams(s, 1));
    op.kind = image::OpKind::kHorizontalFlip;
    op.p = p[0];
  } else if (s.first == "to_tensor") {
    DDP_RETURN_IF_ERROR(NeedParams(s, 0));
    op.kind = image::OpKind::kToTensor;
  } else if (s.first == "pil_to_tensor") {
    DDP_RETURN_IF_ERROR(NeedParams(s, 0));
    op.kind = image::OpKind::kPILToTensor;
  } else if (s.first == "normalize") {
    DDP_RETURN_IF_ERROR(NeedParams(s, 6));
    op.kind = image::OpKind::kNormalize;
    op.mean = {p[0], p[1], p[2]};
    op.std = {p[3], p[4], p[5]};
  } else {
    return InvalidArgumentError("unknown transform op '" + s.first + "'");
  }
  return op;
}

}  // namespace

Result<image::Pipeline> MakePipeline(const std::vector<OpSpec>& specs, bool fixed_size) {
  std::vector<image::TransformOp> ops;
  ops.reserve(specs.size());
  for (const OpSpec& s : specs) {
    DDP_ASSIGN_OR_RETURN(image::TransformOp op, MakeOp(s));
    ops.push_back(op);
  }
  return image::Pipeline::Create(std::move(ops), fixed_size);
}

}  // namespace ddp::py
