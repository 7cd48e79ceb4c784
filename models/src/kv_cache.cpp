#include <flex/hooks/errors.h>
#include <flex/hooks/shape_text.h>
#include <flex/models/kv_cache.h>

#include <ATen/ATen.h>


namespace flex {

std::pair<at::Tensor, at::Tensor> KVCache::update(int64_t layer, const at::Tensor& key, const at::Tensor& value) {
  if (layer < 0) throw ConfigError("KVCache: negative layer index " + std::to_string(layer));
  // Keys and values may differ in width (DeepSeek's latent and rotated key).
  if (key.dim() != 4 || value.dim() != 4 || key.sizes().slice(0, 3) != value.sizes().slice(0, 3))
    throw ShapeError("KVCache layer " + std::to_string(layer) + ": key " + shape_text(key.sizes()) + " and value " +
                     shape_text(value.sizes()) + " must both be [batch, heads, seq, width]");
  if (static_cast<size_t>(layer) >= len_.size()) {
    k_.resize(layer + 1);
    v_.resize(layer + 1);
    len_.resize(layer + 1, 0);
  }
  const int64_t t = key.size(2);
  if (capacity_ > 0) return update_static(layer, key, value);
  int64_t& len = len_[layer];
  at::Tensor& kbuf = k_[layer];
  at::Tensor& vbuf = v_[layer];
  if (len > 0) {
    if (kbuf.size(0) != key.size(0) || kbuf.size(1) != key.size(1) || kbuf.size(3) != key.size(3) || vbuf.size(3) != value.size(3) ||
        kbuf.scalar_type() != key.scalar_type())
      throw ShapeError("KVCache layer " + std::to_string(layer) + " holds keys of shape " +
                       shape_text(kbuf.narrow(2, 0, len).sizes()) + " (" + std::string(c10::toString(kbuf.scalar_type())) +
                       "); cannot append " + shape_text(key.sizes()) + " (" +
                       std::string(c10::toString(key.scalar_type())) + ")");
  }
  // Under autograd, writing into a shared buffer would invalidate views that
  // earlier steps saved for backward: concatenate instead.
  if (at::GradMode::is_enabled() && (key.requires_grad() || value.requires_grad())) {
    if (len == 0) {
      kbuf = key;
      vbuf = value;
    } else {
      kbuf = at::cat({kbuf.narrow(2, 0, len), key}, 2);
      vbuf = at::cat({vbuf.narrow(2, 0, len), value}, 2);
    }
    len += t;
    return {kbuf, vbuf};
  }
  const int64_t need = len + t;
  if (!kbuf.defined() || kbuf.size(2) < need || kbuf.device() != key.device()) {
    // Grow geometrically so n decoding steps cost O(n) copies in total.
    const int64_t cap = std::max<int64_t>(need, len == 0 ? need : 2 * need);
    std::vector<int64_t> shape = key.sizes().vec(), vshape = value.sizes().vec();
    shape[2] = vshape[2] = cap;
    at::Tensor nk = at::empty(shape, key.options().requires_grad(false));
    at::Tensor nv = at::empty(vshape, value.options().requires_grad(false));
    if (len > 0) {
      nk.narrow(2, 0, len).copy_(kbuf.narrow(2, 0, len));
      nv.narrow(2, 0, len).copy_(vbuf.narrow(2, 0, len));
    }
    kbuf = nk;
    vbuf = nv;
  }
  kbuf.narrow(2, len, t).copy_(key);
  vbuf.narrow(2, len, t).copy_(value);
  len = need;
  return {kbuf.narrow(2, 0, len), vbuf.narrow(2, 0, len)};
}

void KVCache::make_static(int64_t capacity, at::Tensor cache_position) {
  if (capacity <= 0) throw ConfigError("KVCache::make_static: capacity must be positive, got " + std::to_string(capacity));
  if (!cache_position.defined() || cache_position.dim() != 1 || cache_position.scalar_type() != at::kLong)
    throw ShapeError("KVCache::make_static: cache_position must be a 1-d int64 tensor");
  for (size_t l = 0; l < len_.size(); ++l) {
    const int64_t len = len_[l];
    if (len > capacity)
      throw ShapeError("KVCache::make_static: layer " + std::to_string(l) + " holds " + std::to_string(len) +
                       " tokens, more than the capacity " + std::to_string(capacity));
    if (len == 0 || !k_[l].defined()) continue;
    std::vector<int64_t> ks = k_[l].sizes().vec(), vs = v_[l].sizes().vec();
    ks[2] = vs[2] = capacity;
    // Zeros, not garbage: a masked slot's weight is exactly 0, and 0 * NaN would not be.
    at::Tensor nk = at::zeros(ks, k_[l].options()), nv = at::zeros(vs, v_[l].options());
    nk.narrow(2, 0, len).copy_(k_[l].narrow(2, 0, len));
    nv.narrow(2, 0, len).copy_(v_[l].narrow(2, 0, len));
    k_[l] = nk;
    v_[l] = nv;
  }
  capacity_ = capacity;
  cache_position_ = std::move(cache_position);
}

std::pair<at::Tensor, at::Tensor> KVCache::update_static(int64_t layer, const at::Tensor& key, const at::Tensor& value) {
  at::Tensor& kbuf = k_[layer];
  at::Tensor& vbuf = v_[layer];
  if (!kbuf.defined() || kbuf.size(0) != key.size(0) || kbuf.size(1) != key.size(1) || kbuf.size(3) != key.size(3) ||
      vbuf.size(3) != value.size(3) || kbuf.scalar_type() != key.scalar_type() || kbuf.device() != key.device() ||
      cache_position_.numel() != key.size(2))
    throw ShapeError("KVCache layer " + std::to_string(layer) + " (static, " + std::to_string(capacity_) +
                     " slots): cannot write keys " + shape_text(key.sizes()) + " at " +
                     std::to_string(cache_position_.numel()) + " cache positions into " +
                     (kbuf.defined() ? shape_text(kbuf.sizes()) : std::string("an empty layer")));
  kbuf.index_copy_(2, cache_position_, key);
  vbuf.index_copy_(2, cache_position_, value);
  return {kbuf, vbuf};
}

int64_t KVCache::seq_length(int64_t layer) const {
  if (capacity_ > 0) return capacity_;
  if (layer < 0 || static_cast<size_t>(layer) >= len_.size()) return 0;
  return len_[layer];
}

at::Tensor KVCache::key(int64_t layer) const {
  if (layer < 0 || static_cast<size_t>(layer) >= len_.size() || len_[layer] == 0) return {};
  if (capacity_ > 0) return k_[layer];
  return k_[layer].narrow(2, 0, len_[layer]);
}

at::Tensor KVCache::value(int64_t layer) const {
  if (layer < 0 || static_cast<size_t>(layer) >= len_.size() || len_[layer] == 0) return {};
  if (capacity_ > 0) return v_[layer];
  return v_[layer].narrow(2, 0, len_[layer]);
}

void KVCache::clear() {
  capacity_ = 0;
  cache_position_ = at::Tensor();
  k_.clear();
  v_.clear();
  len_.clear();
}

Value KVCache::as_value(const c10::intrusive_ptr<KVCache>& cache) {
  if (!cache) return Value();
  return Value::make_capsule(c10::intrusive_ptr<torch::CustomClassHolder>(cache));
}

c10::intrusive_ptr<KVCache> KVCache::from_value(const Value& v) {
  if (v.isNone()) return {};
  if (!v.isCapsule()) throw ConfigError("past_key_values must be a flex::KVCache (or None), got " + v.tagKind());
  auto holder = v.toCapsule();
  auto* cache = dynamic_cast<KVCache*>(holder.get());
  if (!cache) throw ConfigError("past_key_values holds an object that is not a flex::KVCache");
  return c10::intrusive_ptr<KVCache>::reclaim_copy(cache);
}

}  // namespace flex
