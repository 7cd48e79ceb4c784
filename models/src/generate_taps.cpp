#include "generate_taps.h"

#include "common.h"

#include <flex/hooks/errors.h>
#include <flex/hooks/shape_text.h>

#include <ATen/ATen.h>

namespace flex::detail {

GenerateTaps::GenerateTaps(Module& model, const std::vector<std::string>& names) {
  for (const std::string& name : names) {
    if (out_.count(name)) continue;
    std::shared_ptr<Module> m = model.get_submodule(name);  // NotFoundError with close names
    out_[name];
    handles_.push_back(m->register_forward_hook([this, name](Module&, const Inputs&, Value& output) {
      const at::Tensor t = first_tensor(output, "tap " + name).detach();
      if (!static_) {
        out_[name].push_back(t.clone());
        return;
      }
      at::Tensor& buf = buffers_[name];
      if (!buf.defined()) {
        buf = t.clone();
      } else if (buf.sizes() != t.sizes() || buf.scalar_type() != t.scalar_type()) {
        throw ShapeError("tap " + name + ": the static step gave " + shape_text(t.sizes()) + " where an earlier step gave " +
                         shape_text(buf.sizes()));
      } else {
        buf.copy_(t);
      }
    }));
  }
}

GenerateTaps::~GenerateTaps() {
  for (auto& h : handles_) h.remove();
}

void GenerateTaps::collect() {
  for (auto& [name, buf] : buffers_)
    if (buf.defined()) out_[name].push_back(buf.clone());
}

}  // namespace flex::detail
