#pragma once
// Accelerate's operations on nested values (accelerate.utils.operations),
// over a Communicator: a Value is a tensor or any nesting of tuples, lists
// and string-keyed dicts of them (and of other values, which pass through).
//
// The collectives first check, in one extra all-gather, that every rank
// passed the same structure (and the shapes the operation needs equal), so a
// mismatch is a typed error on every rank instead of a hang or a wrong tensor.
//
//   auto all = flex::gather(*world, flex::Value(predictions));   // [n * B, ...] on every rank
//   auto padded = flex::pad_across_processes(*world, v, /*dim=*/1);
#include <flex/hooks/value.h>
#include <flex/parallel/communicator.h>

#include <nlohmann/json.hpp>

#include <functional>
#include <vector>

namespace flex {

/// Applies `fn` to every leaf of `data` for which `test_type` holds (default:
/// tensors), rebuilding tuples, lists and dicts. Other leaves are kept, or a
/// ConfigError naming their type when `error_on_other_type`.
Value recursively_apply(const std::function<Value(const Value&)>& fn, const Value& data,
                        const std::function<bool(const Value&)>& test_type = {}, bool error_on_other_type = false);

/// Every rank's tensors concatenated on dim 0 (0-d tensors become [1]), on
/// every rank. Shapes must be equal across ranks (ShapeError naming the ranks;
/// pad_across_processes first for uneven ones).
Value gather(Communicator& comm, const Value& data);

/// Every rank's `object` (anything torch::pickle_save takes: tensors,
/// numbers, strings, nested containers), in rank order, on every rank; a
/// list's elements are flattened into the result, as Accelerate does.
std::vector<Value> gather_object(Communicator& comm, const Value& object);

/// `from_process`'s tensors copied to every rank (same structure and shapes).
Value broadcast(Communicator& comm, const Value& data, int from_process = 0);

/// Replaces `objects` on every rank by `from_process`'s (pickled).
void broadcast_object_list(Communicator& comm, std::vector<Value>& objects, int from_process = 0);

enum class Reduction { Mean, Sum, None };
/// Elementwise sum or mean over ranks of every tensor, times `scale`
/// (Accelerate applies scale on XLA only; here always). The mean of, or a
/// scale on, integer tensors is a ConfigError. None returns a copy.
Value reduce(Communicator& comm, const Value& data, Reduction reduction = Reduction::Mean, double scale = 1.0);

/// Pads every tensor along `dim` to the largest size any rank has there,
/// with `pad_index`, at the end (or the start with `pad_first`), so that the
/// result can be gathered. Tensors with fewer than dim + 1 dims are kept.
Value pad_across_processes(Communicator& comm, const Value& data, int64_t dim = 0, double pad_index = 0,
                           bool pad_first = false);

/// Structures of the same shape, their tensors concatenated along `dim`
/// (ConfigError for another structure, ShapeError for 0-d leaves).
Value concatenate(const std::vector<Value>& data, int64_t dim = 0);

/// Every tensor sliced [start, stop) along dim 0.
Value slice_tensors(const Value& data, int64_t start, int64_t stop);

/// float16 / bfloat16 tensors as float32; the rest unchanged.
Value convert_to_fp32(const Value& data);

/// Accelerate's convert_outputs_to_fp32: `forward` (any callable returning a
/// Value or a tensor) wrapped so that its result goes through convert_to_fp32.
template <class Forward>
auto convert_outputs_to_fp32(Forward forward) {
  return [f = std::move(forward)](auto&&... args) -> Value {
    return convert_to_fp32(Value(f(std::forward<decltype(args)>(args)...)));
  };
}

/// The data as JSON: tensors as (nested) lists of numbers, tuples and lists
/// as arrays, dicts as objects.
nlohmann::json listify(const Value& data);

}  // namespace flex
