// Every parser at a boundary (GGUF files, chat templates, HTTP request
// bodies, tokenizer input) fed hostile inputs: each must succeed or throw the
// boundary's error (kvserve::Error, or ApiError for a request), never a
// standard-library exception, a crash or a hang. The fuzz targets in
// tests/fuzz/ search for more such inputs; what they find is added here.
#include <gtest/gtest.h>

#include <cstring>
#include <limits>
#include <typeinfo>

#include "core/error.h"
#include "model/config.h"
#include "model/gguf.h"
#include "model/model.h"
#include "server/api_error.h"
#include "server/request_parser.h"
#include "tokenizer/chat_template.h"
#include "tiny_vocab.h"

using namespace kvserve;
using json = nlohmann::json;

namespace {

// Runs f; fails the test if it throws anything but the boundary errors.
template <typename F>
void expect_clean(const std::string& what, F f) {
  try {
    f();
  } catch (const Error&) {
  } catch (const server::ApiError& e) {
    EXPECT_EQ(e.status(), 400) << what << ": " << e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << what << ": escaped " << typeid(e).name() << ": " << e.what();
  }
}

// GGUF reader, config, tokenizer, chat template and weights, as `kvserve serve` loads them.
void load_everything(const std::vector<uint8_t>& bytes) {
  const test_util::MemoryFile file(bytes);
  const GGUFFile gguf(file.path());
  ModelConfig::from_gguf(gguf);
  Tokenizer::from_gguf(gguf);
  ChatTemplate::for_model(gguf);
  ModelLoadOptions options;
  options.repack = false;
  Model::load(file.path(), options);
}

void overwrite_u64(std::vector<uint8_t>& bytes, size_t at, uint64_t v) { std::memcpy(bytes.data() + at, &v, sizeof v); }

}  // namespace

TEST(HostileInput, TheTinyModelLoads) {
  EXPECT_NO_THROW(load_everything(test_util::tiny_model_writer().serialize()));
}

TEST(HostileInput, GgufTruncatedOrCorrupted) {
  const std::vector<uint8_t> good = test_util::tiny_model_writer().serialize();
  for (size_t size = 0; size < good.size(); size += size < 512 ? 1 : 61)
    expect_clean("truncated to " + std::to_string(size), [&] {
      load_everything(std::vector<uint8_t>(good.begin(), good.begin() + static_cast<std::ptrdiff_t>(size)));
    });
  for (size_t at = 0; at < good.size(); at += 7) {
    for (uint8_t flip : {0x01, 0x80, 0xff}) {
      std::vector<uint8_t> bad = good;
      bad[at] ^= flip;
      expect_clean("byte " + std::to_string(at) + " ^ " + std::to_string(flip), [&] { load_everything(bad); });
    }
  }
  for (uint64_t huge : {uint64_t{1} << 62, ~uint64_t{0}, uint64_t{1} << 32}) {
    for (size_t at : {size_t{8}, size_t{16}, size_t{24}}) {  // tensor count, metadata count, first key length
      std::vector<uint8_t> bad = good;
      overwrite_u64(bad, at, huge);
      expect_clean("u64 at " + std::to_string(at), [&] { load_everything(bad); });
    }
  }
}

// Gemma 3's window and layer pattern: values that would wrap to negative
// int64 (a window of 2^63, a period of 2^64 - 1) are refused, not computed with.
TEST(HostileInput, Gemma3SlidingWindowOutOfRange) {
  const auto gemma_writer = [] {
    GGUFWriter w = test_util::tiny_model_writer();
    w.set_string("general.architecture", "gemma3");
    w.set_u32("gemma3.context_length", 64);
    w.set_u32("gemma3.embedding_length", 4);
    w.set_u32("gemma3.block_count", 1);
    w.set_u32("gemma3.feed_forward_length", 8);
    w.set_u32("gemma3.attention.head_count", 1);
    w.set_u32("gemma3.attention.head_count_kv", 1);
    return w;
  };
  for (uint64_t value : {uint64_t{1} << 63, ~uint64_t{0}, (uint64_t{1} << 40) + 1}) {
    GGUFWriter window = gemma_writer();
    window.set_u64("gemma3.attention.sliding_window", value);
    expect_clean("sliding_window " + std::to_string(value), [&] { load_everything(window.serialize()); });
    EXPECT_THROW(ModelConfig::from_gguf(GGUFFile(test_util::MemoryFile(window.serialize()).path())), Error);
    GGUFWriter pattern = gemma_writer();
    pattern.set_u32("gemma3.attention.sliding_window", 16);
    pattern.set_u64("gemma3.attention.sliding_window_pattern", value);
    expect_clean("sliding_window_pattern " + std::to_string(value), [&] { load_everything(pattern.serialize()); });
  }
}

// A Qwen MoE file's expert counts and stacked expert tensors: counts of 0,
// more used than exist or past any real model, widths that would size huge
// buffers, and expert tensors of the wrong shape are refused with an Error.
TEST(HostileInput, MixtureOfExpertsCountsAndShapes) {
  constexpr int64_t kDim = 4, kExperts = 3, kWidth = 8;
  const auto moe_writer = [](uint64_t experts, uint64_t used, uint64_t width, int64_t tensor_experts,
                             const std::string& arch = "qwen2moe") {
    GGUFWriter w = test_util::tiny_model_writer();
    w.set_string("general.architecture", arch);
    w.set_u32(arch + ".context_length", 64);
    w.set_u32(arch + ".embedding_length", kDim);
    w.set_u32(arch + ".block_count", 1);
    w.set_u32(arch + ".feed_forward_length", kWidth);
    w.set_u32(arch + ".attention.head_count", 1);
    w.set_u32(arch + ".attention.head_count_kv", 1);
    w.set_u64(arch + ".expert_count", experts);
    w.set_u64(arch + ".expert_used_count", used);
    w.set_u64(arch + ".expert_feed_forward_length", width);
    if (arch == "deepseek") w.set_u32("deepseek.expert_shared_count", 1);
    const auto tensor = [&w](const std::string& name, std::vector<int64_t> ne) {
      int64_t n = 1;
      for (int64_t d : ne) n *= d;
      w.add_f32_tensor(name, ne, std::vector<float>(static_cast<size_t>(n), 0.25f));
    };
    tensor("blk.0.ffn_gate_inp.weight", {kDim, kExperts});
    tensor("blk.0.ffn_gate_exps.weight", {kDim, kWidth, tensor_experts});
    tensor("blk.0.ffn_up_exps.weight", {kDim, kWidth, tensor_experts});
    tensor("blk.0.ffn_down_exps.weight", {kWidth, kDim, tensor_experts});
    tensor("blk.0.ffn_gate_inp_shexp.weight", {kDim});
    tensor("blk.0.ffn_gate_shexp.weight", {kDim, kWidth});
    tensor("blk.0.ffn_up_shexp.weight", {kDim, kWidth});
    tensor("blk.0.ffn_down_shexp.weight", {kWidth, kDim});
    return w;
  };
  EXPECT_NO_THROW(load_everything(moe_writer(kExperts, 2, kWidth, kExperts).serialize()));
  const auto refused = [&](const std::string& what, const GGUFWriter& w) {
    expect_clean(what, [&] { load_everything(w.serialize()); });
    EXPECT_THROW(load_everything(w.serialize()), Error) << what;
  };
  for (uint64_t bad : {uint64_t{0}, uint64_t{4097}, uint64_t{1} << 40, ~uint64_t{0}})
    refused("expert_count " + std::to_string(bad), moe_writer(bad, 2, kWidth, kExperts));
  for (uint64_t bad : {uint64_t{0}, uint64_t{4}, ~uint64_t{0}})
    refused("expert_used_count " + std::to_string(bad), moe_writer(kExperts, bad, kWidth, kExperts));
  for (uint64_t bad : {uint64_t{0}, uint64_t{1} << 30, ~uint64_t{0}, uint64_t{16}})
    refused("expert_feed_forward_length " + std::to_string(bad), moe_writer(kExperts, 2, bad, kExperts));
  refused("2 stacked experts of 3", moe_writer(kExperts, 2, kWidth, 2));
  // One width per layer (an array, as llama.cpp's converter may write it): taken when all agree.
  GGUFWriter per_layer = moe_writer(kExperts, 2, kWidth, kExperts);
  per_layer.set_i32_array("qwen2moe.expert_feed_forward_length", {static_cast<int32_t>(kWidth)});
  EXPECT_NO_THROW(load_everything(per_layer.serialize()));
  GGUFWriter differing = moe_writer(kExperts, 2, kWidth, kExperts);
  differing.set_i32_array("qwen2moe.expert_feed_forward_length", {static_cast<int32_t>(kWidth), 16});
  refused("differing per-layer widths", differing);
  // deepseek: its shared-expert count, dense leading blocks and weight scale are bounded too.
  const auto deepseek = [&] { return moe_writer(kExperts, 2, kWidth, kExperts, "deepseek"); };
  EXPECT_NO_THROW(load_everything(deepseek().serialize()));
  GGUFWriter dense_first = deepseek();
  dense_first.set_u32("deepseek.leading_dense_block_count", 1);  // block 0 is then tiny_model_writer's dense FFN
  EXPECT_NO_THROW(load_everything(dense_first.serialize()));
  for (uint64_t bad : {uint64_t{0}, uint64_t{5000}, ~uint64_t{0}}) {
    GGUFWriter w = deepseek();
    w.set_u64("deepseek.expert_shared_count", bad);
    refused("expert_shared_count " + std::to_string(bad), w);
  }
  GGUFWriter too_dense = deepseek();
  too_dense.set_u64("deepseek.leading_dense_block_count", 2);
  refused("2 dense blocks of 1", too_dense);
  for (float bad : {-1.0f, std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity()}) {
    GGUFWriter w = deepseek();
    w.set_f32("deepseek.expert_weights_scale", bad);
    refused("expert_weights_scale " + std::to_string(bad), w);
  }
}

// deepseek2 (MLA): the latent sizes are bounded and must agree with each
// other and with the tensors; the older fused attn_kv_b layout, an unknown
// gating function and expert groups that cannot split the experts are refused.
TEST(HostileInput, LatentAttentionSizesAndRouter) {
  // dim 4, one head: 2 latent + 2 RoPE dims cached, 2 + 2 query/key dims and 4 value dims per head.
  // fused: the older layout (key/value_length the decompressed sizes 4 / 4, one attn_kv_b of 1 x (2 + 4) rows).
  const auto mla_writer = [](bool fused = false) {
    GGUFWriter w = test_util::tiny_model_writer();
    const std::string a = "deepseek2.";
    w.set_string("general.architecture", "deepseek2");
    w.set_u32(a + "context_length", 64);
    w.set_u32(a + "embedding_length", 4);
    w.set_u32(a + "block_count", 1);
    w.set_u32(a + "feed_forward_length", 8);
    w.set_u32(a + "attention.head_count", 1);
    w.set_u32(a + "attention.head_count_kv", 1);
    w.set_u32(a + "rope.dimension_count", 2);
    w.set_u32(a + "attention.kv_lora_rank", 2);
    w.set_u32(a + "attention.key_length", 4);
    w.set_u32(a + "attention.value_length", fused ? 4 : 2);
    if (!fused) {
      w.set_u32(a + "attention.key_length_mla", 4);
      w.set_u32(a + "attention.value_length_mla", 4);
    }
    w.set_u32(a + "expert_count", 4);
    w.set_u32(a + "expert_used_count", 2);
    w.set_u32(a + "expert_feed_forward_length", 8);
    w.set_u32(a + "expert_shared_count", 1);
    w.set_u32(a + "leading_dense_block_count", 1);  // the one block keeps tiny_model_writer's dense FFN
    const auto tensor = [&w](const std::string& name, std::vector<int64_t> ne) {
      int64_t n = 1;
      for (int64_t d : ne) n *= d;
      w.add_f32_tensor(name, ne, std::vector<float>(static_cast<size_t>(n), 0.25f));
    };
    tensor("blk.0.attn_kv_a_mqa.weight", {4, 4});
    tensor("blk.0.attn_kv_a_norm.weight", {2});
    if (fused) {
      tensor("blk.0.attn_kv_b.weight", {2, 6});
    } else {
      tensor("blk.0.attn_k_b.weight", {2, 2, 1});
      tensor("blk.0.attn_v_b.weight", {2, 4, 1});
    }
    return w;
  };
  EXPECT_NO_THROW(load_everything(mla_writer().serialize()));
  EXPECT_NO_THROW(load_everything(mla_writer(true).serialize()));
  const auto refused = [&](const std::string& what, const GGUFWriter& w) {
    expect_clean(what, [&] { load_everything(w.serialize()); });
    EXPECT_THROW(load_everything(w.serialize()), Error) << what;
  };
  for (const char* key : {"attention.kv_lora_rank", "attention.key_length_mla", "attention.value_length_mla",
                          "rope.dimension_count", "attention.q_lora_rank", "attention.key_length",
                          "attention.value_length"})
    for (uint64_t bad : {uint64_t{0}, uint64_t{3}, uint64_t{1} << 20, uint64_t{1} << 40, ~uint64_t{0}}) {
      GGUFWriter w = mla_writer();
      w.set_u64(std::string("deepseek2.") + key, bad);
      expect_clean(std::string(key) + " " + std::to_string(bad), [&] { load_everything(w.serialize()); });
    }
  GGUFWriter fused_wrong = mla_writer(true);
  fused_wrong.set_u32("deepseek2.attention.value_length", 8);  // attn_kv_b then needs 1 x (2 + 8) rows
  refused("attn_kv_b of the wrong shape", fused_wrong);
  GGUFWriter half_split = mla_writer(true);
  half_split.set_u32("deepseek2.attention.key_length_mla", 4);  // one of the two _mla keys
  refused("key_length_mla without value_length_mla", half_split);
  GGUFWriter short_key = mla_writer();
  short_key.set_u32("deepseek2.attention.key_length_mla", 2);
  refused("key_length_mla 2 (not above the RoPE dims)", short_key);
  GGUFWriter mismatch = mla_writer();
  mismatch.set_u32("deepseek2.attention.value_length", 4);
  refused("value_length != kv_lora_rank", mismatch);
  GGUFWriter gating = mla_writer();
  gating.set_u32("deepseek2.expert_gating_func", 3);
  refused("expert_gating_func 3", gating);
  for (uint32_t groups : {2u, 3u, 4u}) {  // groups of 2 experts need 1 of 2 groups (2 >= 2 used); 3 and 4 cannot
    GGUFWriter w = mla_writer();
    w.set_u32("deepseek2.expert_group_count", groups);
    w.set_u32("deepseek2.expert_group_used_count", 1);
    if (groups == 2) EXPECT_NO_THROW(load_everything(w.serialize()));
    else refused("expert_group_count " + std::to_string(groups), w);
  }
  GGUFWriter log_mul = mla_writer();
  log_mul.set_f32("deepseek2.rope.scaling.yarn_log_multiplier", std::numeric_limits<float>::infinity());
  refused("yarn_log_multiplier inf", log_mul);
}

TEST(HostileInput, GgufOutOfRangeConfig) {
  for (const char* key : {"llama.embedding_length", "llama.attention.head_count", "llama.block_count",
                          "llama.attention.key_length", "llama.context_length", "llama.rope.dimension_count"}) {
    for (uint64_t value : {uint64_t{0}, uint64_t{1} << 31, uint64_t{1} << 62, ~uint64_t{0}}) {
      GGUFWriter w = test_util::tiny_model_writer();
      w.set_u64(key, value);  // a second entry for the key; the reader keeps the last
      expect_clean(std::string(key) + " = " + std::to_string(value), [&] { load_everything(w.serialize()); });
    }
  }
}

TEST(HostileInput, ChatTemplates) {
  const std::string deep(5000, '[');
  for (const std::string& source :
       {std::string("{% if 1234567890123456789012345678901234567890 %}x{% endif %}"), "{{ " + deep, "{{ " + deep + " }}",
        std::string("{% for %}"), std::string("{{ x[ }}"), std::string("{{ x[1:2:3:4] }}"), std::string("{% set %}"),
        std::string("{% set x.y.z = 1 %}"), std::string("{{ 'a' * 'b' }}"), std::string("{{ {1: 2} }}"),
        std::string("{{ x(1, y=2, 3) }}"), std::string("{{ [].pop() }}"), std::string("{{ messages|tojson(-5) }}"),
        std::string("{{ 1 // 0 }}"), std::string("{{ 1.0 % 0.0 }}"), std::string("{{ 'x'[9223372036854775807] }}"),
        std::string("{{ 'x'[-9223372036854775807 - 1] }}"), std::string("{{ loop.index }}"),
        std::string("{% for a, b in [1] %}{% endfor %}"), std::string("{{ namespace(1, 2) }}"),
        std::string("{{ raise_exception() }}"), std::string("{{ strftime_now(1) }}"), std::string("{{ '\xff\xfe' }}"),
        std::string("{{ messages[0]|items }}"), std::string("{% if %}"), std::string("{{ range(1, 2, 3) }}"),
        std::string("{{ 'abc'.split('') }}"), std::string("{{ 9223372036854775807 * -9223372036854775807 }}"),
        std::string("\0{{\0}}", 7)})
    expect_clean(source.substr(0, 60), [&] {
      ChatTemplateInputs in;
      in.messages = json::array({{{"role", "user"}, {"content", "Hi"}}});
      ChatTemplate::parse(source).apply(in);
    });
}

TEST(HostileInput, RequestBodies) {
  const Tokenizer tokenizer = test_util::tiny_bpe_tokenizer();
  const ChatTemplate chat_template = ChatTemplate::chatml();
  const server::RequestParser parser(tokenizer, chat_template, 64);
  const std::string deep_array = std::string(100000, '[') + std::string(100000, ']');
  for (const std::string& body :
       {std::string(""), std::string("{"), std::string("\xff"), std::string("[]"), std::string("null"), deep_array,
        "{\"messages\": " + deep_array + "}", std::string("{\"prompt\": [18446744073709551615]}"),
        std::string("{\"prompt\": [[-1]]}"), std::string("{\"prompt\": [1e400]}"), std::string("{\"prompt\": [1.5]}"),
        std::string("{\"prompt\": \"hi\", \"n\": 18446744073709551615}"),
        std::string("{\"prompt\": \"hi\", \"max_tokens\": -9223372036854775808}"),
        std::string("{\"prompt\": \"hi\", \"response_format\": {\"type\": 7}}"),
        std::string("{\"messages\": [{\"role\": \"user\", \"content\": [{\"type\": [1]}]}]}"),
        std::string("{\"messages\": [{\"role\": 1}]}"), std::string("{\"messages\": [{\"role\": \"user\"}]}"),
        std::string("{\"prompt\": \"hi\", \"stop\": [\"\"]}"), std::string("{\"prompt\": \"hi\", \"seed\": -1}"),
        std::string("{\"prompt\": \"hi\", \"speculative\": {\"draft_k\": 18446744073709551615}}"),
        std::string("{\"prompt\": \"hi\", \"temperature\": 1e308}"), std::string("{\"content\": 1}"),
        std::string("{\"content\": \"hi\", \"add_special\": \"yes\"}"), std::string("{\"tokens\": [99999999999]}"),
        std::string("{\"tokens\": [-1, 1.5, \"a\"]}"), std::string("{\"tokens\": {}}")}) {
    for (const server::Endpoint endpoint : {server::Endpoint::kCompletions, server::Endpoint::kChat})
      expect_clean(body.substr(0, 60), [&] { parser.parse(endpoint, server::parse_json_body(body)); });
    expect_clean(body.substr(0, 60), [&] { server::parse_tokenize_request(server::parse_json_body(body)); });
    expect_clean(body.substr(0, 60), [&] {
      server::parse_detokenize_request(server::parse_json_body(body), tokenizer.vocab_size());
    });
  }
}

TEST(HostileInput, TokenizerInput) {
  const Tokenizer tokenizers[] = {test_util::tiny_bpe_tokenizer(), test_util::tiny_spm_tokenizer()};
  for (const Tokenizer& tok : tokenizers) {
    for (const std::string& text : {std::string("\xff\xfe\xc0\x80"), std::string("\xed\xa0\x80"),
                                   std::string("a\0b", 3), std::string(100000, ' '), std::string(50000, '\xe4'),
                                   std::string("<|im_end|><|im_end"), std::string("\xf4\x90\x80\x80")}) {
      expect_clean("encode", [&] { tok.decode(tok.encode(text, true)); });
      expect_clean("encode without specials", [&] { tok.decode(tok.encode(text, false, false)); });
    }
    EXPECT_THROW(tok.decode({-1}), Error);
    EXPECT_THROW(tok.decode({tok.vocab_size()}), Error);
    EXPECT_THROW(tok.token_bytes(INT32_MAX), Error);
  }
}
