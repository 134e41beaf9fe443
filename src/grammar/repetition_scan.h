#pragma once
// A cheap pass over a regex or an EBNF grammar, before it is compiled, that
// finds what makes xgrammar's compile slow: counted repetitions ({n}, {n,},
// {n,m}; Lark's ~ n..m), which xgrammar unrolls into one automaton position
// (and one token-mask computation) per repeated element, nested ones
// multiplied ((a{1000}){1000} is a million positions), and deep group nesting.
// It does not validate the syntax: xgrammar does that afterwards.
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "grammar/constraint_limits.h"

namespace kvserve {

enum class PatternSyntax { kRegex, kEbnf };

// The first cap `text` goes past, as a sentence ("{100000} at offset 3
// repeats 100000 times, at most 1000"), or nullopt when it fits. `repeated`
// accumulates the positions counted repetitions unroll to, over all the
// patterns of one spec (max_repeated_positions bounds the sum).
std::optional<std::string> repetition_over_limits(std::string_view text, PatternSyntax syntax,
                                                  const ConstraintLimits& limits, int64_t& repeated);

}  // namespace kvserve
