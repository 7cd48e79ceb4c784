#include <flex/hooks/graph_recording.h>

namespace flex {

namespace {
thread_local int recording_depth = 0;
}  // namespace

bool graph_recording() { return recording_depth > 0; }

GraphRecordingScope::GraphRecordingScope() { ++recording_depth; }
GraphRecordingScope::~GraphRecordingScope() { --recording_depth; }

}  // namespace flex
