#pragma once
// Jinja's methods (str.split(), dict.items(), ...), filters (| trim,
// | tojson, ...) and tests (is defined, is string, ...) on template values.
#include <string>
#include <vector>

#include "tokenizer/chat_template_values.h"

namespace kvserve::chat_template_detail {

// self.name(args...): string methods, and items / keys / values / get of a dict.
json call_method(const json& self, const std::string& name, const std::vector<json>& a, WorkBudget& work);
// v | name(args...)
json apply_filter(const std::string& name, const json& v, const std::vector<json>& a, WorkBudget& work);
// v is name
bool apply_test(const std::string& name, const json& v);

}  // namespace kvserve::chat_template_detail
