#pragma once
// Whether this thread is running a model step that a CUDA graph will record
// (generate(cuda_graph=true): the warm-up runs and the capture). A graph
// replays only the device work it recorded, so host code in a hook (a
// FlexModel capture's save) would run at recording time and never again:
// such hooks check graph_recording() and refuse, instead of silently
// capturing a few steps out of many.
namespace flex {

/// True while a GraphRecordingScope is alive on this thread.
bool graph_recording();

/// Marks this thread as recording a graph step for its lifetime (nestable).
class GraphRecordingScope {
 public:
  GraphRecordingScope();
  ~GraphRecordingScope();
  GraphRecordingScope(const GraphRecordingScope&) = delete;
  GraphRecordingScope& operator=(const GraphRecordingScope&) = delete;
};

}  // namespace flex
