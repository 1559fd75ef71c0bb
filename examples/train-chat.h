// oomb-train's chat data (--data-format chat): JSONL conversations, rendered in the ChatML form of
// the model's tokenizer.chat_template, tokenized, with a per-token target mask (--train-on), laid
// into sequences of --ctx tokens (--chat-pack, --chat-long) with per-position labels for the
// driver (ChunkDriver::forward_backward's labels; ignore_index where no loss is taken).
//
// Design: no C++ Jinja library is packaged for this system (apt-cache: none), so the template is
// not executed; it is recognised as ChatML by its text (the per-message expression
// '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n', in the
// ['role'] or .role spelling) and its default system message (a literal
// '<|im_start|>system\n...<|im_end|>\n', inserted when the first message is not a system one) is
// read out of it. Any other template is refused, naming its first line and hash. Rendering, for
// each message: <|im_start|>{role}\n{content}<|im_end|>\n (Qwen2 / Qwen2.5 / SmolLM2 render the
// same for system / user / assistant messages without tools; the generation prompt is never added).
#pragma once

#include "train-options.h"

#include "tokenizer.h"

#include <cstdint>
#include <string>
#include <vector>

namespace oomb {
namespace train {

struct ChatMessage {
    std::string role;     // system, user or assistant
    std::string content;
};

/// What oomb-train knows of a chat template.
struct ChatTemplate {
    std::string source;            // for messages: "FILE's tokenizer.chat_template", or "no chat template (FILE)"
    bool has_default_system = false;
    std::string default_system;    // inserted as a first system message when the first message is not one
};

/// Recognises a chat template. tmpl: the tokenizer.chat_template text, NULL when the GGUF has none
/// (then: ChatML without a default system message). false + *err naming the template (its first
/// line and a hash of the whole text) when it is not ChatML.
bool chat_template_recognise(const std::string * tmpl, const std::string & source, ChatTemplate * t, std::string * err);

/// Reads tokenizer.chat_template of a GGUF file (*has = false when absent). false + *err when the
/// file cannot be read or the key is not a string.
bool read_chat_template(const std::string & gguf_path, std::string * tmpl, bool * has, std::string * err);

/// Parses one JSONL line: {"messages": [{"role": "system|user|assistant", "content": "..."}, ...]}
/// (other keys are ignored). need_assistant: at least one assistant message is required. false +
/// *err with the reason (not JSON, no "messages", not an array, empty, a role outside
/// system/user/assistant, content not a string, no assistant turn).
bool parse_chat_line(const std::string & line, bool need_assistant, std::vector<ChatMessage> * msgs, std::string * err);

/// The rendered text of a conversation (the default system message included when it applies).
std::string render_chat_text(const ChatTemplate & t, const std::vector<ChatMessage> & msgs);

/// A conversation's tokens and their target flags: target[i] = 1 when token i is predicted (its
/// loss counts). assistant_only (--train-on assistant): the tokens of each assistant message's
/// content and its <|im_end|>; not its "<|im_start|>assistant\n" header, not the "\n" after
/// <|im_end|>, nothing of system or user turns. Otherwise (--train-on all) every token but the
/// first of the conversation. The text between two special tokens ("{role}\n{content}") is
/// tokenized as one piece, as HF tokenizers do; a token that straddles the header's newline and the
/// content counts as content.
struct ChatTokens {
    std::vector<int32_t> ids;
    std::vector<uint8_t> target;
};

/// Renders and tokenizes a conversation. false + *err when the tokenizer lacks <|im_start|> or
/// <|im_end|>.
bool tokenize_chat(const Tokenizer & tok, const ChatTemplate & t, const std::vector<ChatMessage> & msgs, bool assistant_only,
                   ChatTokens * out, std::string * err);

/// How conversations become sequences of ctx tokens.
struct ChatLayout {
    int64_t ctx = 0;
    bool pack = false;             // --chat-pack: several conversations per sequence, in file order
    std::string long_mode = "error";  // --chat-long: split, skip or error
    int32_t pad = 0;               // id that fills a sequence's tail (its labels are ignore_index)
    int32_t ignore_index = -100;
};

/// Sequences of exactly ctx tokens with per-position labels: labels[i] = ids[i + 1] when token
/// i + 1 of the same sequence is a target, else ignore_index. Without pack, one conversation per
/// sequence, padded; with pack, conversations follow each other (as the template renders them, each
/// from its <|im_start|>) while they fit whole, then padding. A conversation longer than ctx:
/// long_mode error: false + *err (the caller names the line); skip: dropped (counted); split: cut
/// into pieces of ctx tokens, each its own sequence (later pieces start without the earlier ones'
/// context; the last piece is laid out as a short conversation). Sequences with no target are
/// dropped (counted).
struct ChatSequences {
    std::vector<int32_t> ids, labels;  // n_seqs * ctx each
    int64_t n_seqs = 0;
    int64_t n_targets = 0;             // labels that are not ignore_index
    int64_t n_real = 0;                // tokens that are not padding
    int64_t n_skipped_long = 0, n_split_long = 0, n_no_target = 0;
    ChatTokens open;                   // the sequence in progress (packing)
};

/// Adds conversation c (from input line `line`) to the sequences. false + *err on a conversation
/// longer than ctx with long_mode error.
bool layout_chat(const ChatLayout & L, const ChatTokens & c, ChatSequences * s, std::string * err);
/// Pads and closes the sequence in progress (call after the last conversation).
void layout_chat_finish(const ChatLayout & L, ChatSequences * s);

/// The extensions of the files read from a folder of chat data: .jsonl and .jsonl.gz (any other
/// file there, e.g. a README, is skipped with a note; a file named explicitly is always read).
const std::vector<std::string> & chat_file_extensions();

/// Reads JSONL conversation files (each path a file or a folder of files; .gz read directly) into
/// conversations (from folders: the chat_file_extensions() files only); bad lines fail (exit 1) naming FILE:LINE and the reason, or with skip_bad_lines
/// are counted (and the first ones printed). Blank lines are skipped. where: "FILE:LINE" of each
/// conversation, for later messages.
struct ChatFileStats { int64_t n_lines = 0, n_bad = 0, n_convs = 0; };
void read_chat_files(const std::vector<std::string> & paths, const char * opt, bool need_assistant, bool skip_bad_lines,
                     std::vector<std::vector<ChatMessage>> * convs, std::vector<std::string> * where, ChatFileStats * st);

} // namespace train
} // namespace oomb
