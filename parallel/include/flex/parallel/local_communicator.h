#pragma once
// A communicator of one process (size 1): every collective is a copy, so code
// written for many ranks runs unchanged without MPI.
#include <flex/parallel/communicator.h>

#include <deque>
#include <map>

namespace flex {

class LocalCommunicator : public Communicator {
 public:
  explicit LocalCommunicator(std::string name = "world") : name_(std::move(name)) {}

  int rank() const override { return 0; }
  int size() const override { return 1; }
  const std::string& name() const override { return name_; }
  const char* backend() const override { return "local"; }

  void barrier() override {}
  void broadcast(at::Tensor& t, int root) override;
  /// Sending to oneself queues the tensor (a copy) for a later recv.
  void send(const at::Tensor& t, int dst, int tag = 0) override;
  at::Tensor recv(int src, int tag = 0) override;
  std::vector<at::Tensor> gather(const at::Tensor& t, int root) override;
  std::vector<at::Tensor> all_gather(const at::Tensor& t) override;
  void all_reduce(at::Tensor& t, ReduceOp op = ReduceOp::Sum) override;
  at::Tensor reduce(const at::Tensor& t, int root, ReduceOp op = ReduceOp::Sum) override;
  at::Tensor reduce_scatter(const at::Tensor& t, ReduceOp op = ReduceOp::Sum) override;
  std::shared_ptr<Communicator> split(int color, int key, const std::string& name) override;

 private:
  void check_rank(int r, const char* what) const;
  void check_dtype(const at::Tensor& t, const char* what) const;
  std::string name_;
  std::map<int, std::deque<at::Tensor>> queued_;  // tag -> tensors sent to self
};

}  // namespace flex
