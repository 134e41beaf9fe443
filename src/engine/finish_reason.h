#pragma once
// Why a sequence ended, inside the engine; GenerationEvent::finish_reason
// carries it as the API's string.
namespace kvserve {

enum class FinishReason { kNone, kStop, kLength, kCancelled, kError };

// "stop", "length", "cancelled", "error" ("" for kNone: not finished).
constexpr const char* to_string(FinishReason reason) {
  switch (reason) {
    case FinishReason::kStop: return "stop";
    case FinishReason::kLength: return "length";
    case FinishReason::kCancelled: return "cancelled";
    case FinishReason::kError: return "error";
    case FinishReason::kNone: break;
  }
  return "";
}

}  // namespace kvserve
