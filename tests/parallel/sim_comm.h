#pragma once
// A communicator that only reports a rank and a size: lets one process build
// every rank's tensor-parallel module and combine their local results. Any
// communication is a test bug and throws.
#include <flex/parallel/communicator.h>

namespace flex_test {

class RankOnlyComm : public flex::Communicator {
 public:
  RankOnlyComm(int rank, int size) : rank_(rank), size_(size) {}
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const std::string& name() const override { return name_; }
  const char* backend() const override { return "rank-only"; }
  void barrier() override { no(); }
  void broadcast(at::Tensor&, int) override { no(); }
  void send(const at::Tensor&, int, int) override { no(); }
  at::Tensor recv(int, int) override { no(); }
  std::vector<at::Tensor> gather(const at::Tensor&, int) override { no(); }
  std::vector<at::Tensor> all_gather(const at::Tensor&) override { no(); }
  void all_reduce(at::Tensor&, flex::ReduceOp) override { no(); }
  at::Tensor reduce(const at::Tensor&, int, flex::ReduceOp) override { no(); }
  at::Tensor reduce_scatter(const at::Tensor&, flex::ReduceOp) override { no(); }
  std::shared_ptr<flex::Communicator> split(int, int, const std::string&) override { no(); }

 private:
  [[noreturn]] static void no() { throw flex::UnsupportedError("RankOnlyComm cannot communicate"); }
  int rank_, size_;
  std::string name_ = "sim";
};

}  // namespace flex_test
