#pragma once
// Feature edits: editing functions for a spliced dictionary's hook points
// (flex/sae/splice.h). The first three act on feature activations
// (<module>.sae.hook_sae_acts_post, [..., T, d_sae] or [..., d_sae]); steering
// adds a decoder row to an activation of width d_out (the dictionary's
// hook_sae_recons or output, or the model's module itself). `positions`:
// sequence positions (dim -2) to edit; empty: all.
#include <flex/flexcore/hook_function.h>
#include <flex/sae/sparse_dictionary.h>

#include <cstdint>
#include <vector>

namespace flex {

EditFn ablate_features(std::vector<int64_t> features, std::vector<int64_t> positions = {});
EditFn clamp_feature(int64_t feature, double value, std::vector<int64_t> positions = {});
EditFn scale_feature(int64_t feature, double factor, std::vector<int64_t> positions = {});
/// activation + alpha * W_dec[feature].
EditFn steer_feature(const SparseDictionary& sae, int64_t feature, double alpha, std::vector<int64_t> positions = {});

}  // namespace flex
