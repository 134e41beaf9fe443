#pragma once
// The per-request "speculative" field of /v1/completions and
// /v1/chat/completions (a kvserve extension; docs/server.md):
//   absent or null       the server default (`kvserve serve --spec ngram|draft --draft-k K`)
//   true / false         n-gram drafts with the server's draft_k / no speculation
//   {"mode": "ngram" | "draft" | "none", "draft_k": 1..32, "adaptive_k": bool}
//                        each key optional; an object without "mode" means "ngram";
//                        "draft" needs a server started with --draft FILE
// Throws ApiError 400 naming the field ("speculative", "speculative.draft_k").
#include <nlohmann/json.hpp>

#include "engine/engine.h"

namespace kvserve::server {

SpeculationSettings parse_speculation(const nlohmann::json& body, const SpeculationSettings& server_default,
                                      bool has_draft_model);

}  // namespace kvserve::server
