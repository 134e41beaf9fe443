#pragma once
// Prometheus text of several sources in one exposition: each source's samples
// get a label naming it, and the samples of one metric family are grouped
// under one # HELP / # TYPE, as the text format requires (per-model /metrics
// of a many-model server; docs/server.md, "Many models").
#include <string>
#include <utility>
#include <vector>

namespace kvserve::server {

// A Prometheus label value: \, " and newlines escaped.
std::string prometheus_label_value(const std::string& value);

// sources: (label value, exposition text). Families keep the order they first appear in; each sample gets
// label_name="value" first among its labels. Lines that are neither comments nor samples are dropped.
std::string merge_labelled(const std::vector<std::pair<std::string, std::string>>& sources,
                           const std::string& label_name);

}  // namespace kvserve::server
