// libFuzzer target: config.json (load_config), then building the model it
// describes on the meta device when it is small enough to build quickly.
#include "fuzz_util.h"

#include <flex/hooks/empty_init.h>
#include <flex/models/auto_model.h>
#include <flex/models/config.h>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace flex_fuzz;
  const std::string path = scratch() + "/config.json";
  write_bytes(path, data, size);
  guarded([&] {
    flex::ModelConfig cfg = flex::load_config(path);
    check(cfg.hidden_size > 0 && cfg.num_attention_heads > 0 && cfg.vocab_size > 0, "sizes are positive");
    (void)cfg.rotary_dim();
    (void)cfg.causal_lm_class();
    if (cfg.num_hidden_layers > 4 || cfg.hidden_size > 4096 || cfg.intermediate_size > 16384 ||
        cfg.vocab_size > 100000 || cfg.num_attention_heads > 64)
      return;
    flex::EmptyInit meta;
    (void)flex::build_causal_lm(cfg);
  });
  return 0;
}
