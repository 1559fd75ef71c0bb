// Helpers shared by oomb-train and oomb-eval: locating the project's files, reading and tokenizing
// training text (plain or gzip), binary id files, hashing, process memory, the loss-curve PNG,
// formatting, and turning library errors into a clean exit.
#pragma once

#include "oomb.h"
#include "oomb-backend.h"
#include "tokenizer.h"

#include <CLI/CLI.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace oomb {
namespace train {

// Library errors (oomb_error) print "<prog>: error: <message>" and exit with `code` instead of
// aborting. The process exits at once (_exit) after flushing stdio.
void install_error_handler(const char * prog, int code = 1);

// Prints "<prog>: error: <message>" to stderr. fail() also exits with `code`.
void print_error(const char * prog, const std::string & msg);
[[noreturn]] void fail(const char * prog, const std::string & msg, int code = 1);
// Range check of a numeric option: when !ok, fail with "<name> <v> is out of range: it must be <range>".
void need_in_range(const char * prog, bool ok, const char * name, double v, const std::string & range);

// The checks of the options oomb-train and oomb-eval share, in one place: --ctx >= 2, --chunk >= 1,
// --page >= 1 (and at most --ctx when given), --threads >= 1 and a finite --rope-theta > 0 when
// given. Fails (exit 1) naming the option and its range.
void check_chunk_options(const char * prog, const CLI::App & app, int64_t ctx, int64_t chunk, int page, int threads, double rope_theta);
// The CPU thread count: n when positive, else every core.
int threads_default(int n);

// Parses the command line: returns -1 when the program should go on, else the exit code (0 after
// --help; 1 after a parse error, printed as "<prog>: error: ... (see --help)"). sibling: another
// tool's option table (train_option_table() for oomb-eval): an option of it that app does not have
// is then named as the sibling's ("--kv-grad-type is an option of oomb-train, not of oomb-eval").
int parse_command_line(CLI::App & app, int argc, char ** argv, const char * prog, const CLI::App * sibling = nullptr);

// Directory holding the running executable ("" if unknown).
std::string exe_dir();
// Finds a project file (e.g. "models/qwen2.5-vocab.gguf") relative to the executable
// (<exe>/../../REL, <exe>/../REL: build/bin -> source dir) and then the current directory.
// Returns the first existing path, or "" when none exists.
std::string find_project_file(const std::string & rel);

bool is_dir(const std::string & p);
bool is_file(const std::string & p);
/// Why `p` is not a readable regular file, for an error message: "'p': no such file", or
/// "'p' is a folder, not a file" (e.g. an output folder given where its adapter.gguf is meant).
std::string not_a_file(const std::string & p);
/// Why `p` is neither a regular file nor a folder: "'p': no such file or folder", or "'p' is not a regular
/// file or folder (a character device)" (/dev/zero, a FIFO: never read as data).
std::string not_a_file_or_folder(const std::string & p);
/// "a character device", "a FIFO", ... for a stat st_mode.
std::string file_kind(unsigned mode);
/// Whether s ends with suffix (file extensions: ".jsonl", ".gz").
bool ends_with(const std::string & s, const std::string & suffix);
bool make_dirs(const std::string & p, std::string * err);

// Every regular file under `path` (itself when it is a file; recursively, sorted by path when it
// is a folder; hidden entries skipped). Error when the path does not exist or holds no file.
// In a folder each file is listed once and each folder entered once, by device + inode: symbolic
// links to a file or folder read already (or a link back up, a loop) are skipped with a note.
// folder_exts (e.g. {".jsonl", ".jsonl.gz"}): when not empty, a folder's files are listed only when
// their names end with one of them (a file named explicitly always is); the others are appended to
// *skipped (when given), and a folder with none of them is an error naming the extensions.
bool list_files(const std::string & path, std::vector<std::string> * out, std::string * err,
                const std::vector<std::string> & folder_exts = {}, std::vector<std::string> * skipped = nullptr);
// Leaves folder dir (compared by device + inode when listed; it need not exist yet) out of list_files' folder walks,
// with a note, and makes listing it itself an error: oomb-train's --out, so that a run whose output folder lies
// inside its --data folder does not read its own log (train.jsonl) as text, which changed the data (and its hash,
// so --resume refused) from one run to the next. The walks also skip, with a note, any folder holding both .lock
// and train.jsonl: another oomb-train run's output folder.
void data_exclude_folder(const std::string & dir);
// Reads a whole file; files ending in ".gz" are decompressed (zlib).
bool read_text_file(const std::string & path, std::string * out, std::string * err);

// "" when `text` is text (UTF-8 without NUL bytes), all of it; otherwise why not: "a NUL byte at offset N",
// "invalid UTF-8 at offset N" (the first such byte). One pass, ASCII 8 bytes at a time.
std::string not_text_reason(const std::string & text);

// Tokenizes text files/folders (in folders, hidden entries are not read and non-text files are
// skipped with a note; a non-text file named explicitly is an error): each file is split at the literal "<|endoftext|>" into documents,
// every document is encoded with `tok` (added tokens in the text are recognised) on `n_threads`
// threads, and documents are joined with `eos` (one eos after every document). Appends to `ids`.
// Reports bytes read in *n_bytes.
bool tokenize_paths(const Tokenizer & tok, const std::vector<std::string> & paths, int32_t eos, int n_threads,
                    std::vector<int32_t> * ids, size_t * n_bytes, std::string * err);
// The tokenizer of a model GGUF: Loaded (into *tok), Absent (the file has no tokenizer.ggml.model:
// a weights-only file), or Failed (*err: the file has tokenizer keys that cannot be used, e.g. an
// unknown tokenizer.ggml.pre; callers stop there rather than fall back to another vocabulary).
enum class ModelTokenizer { Loaded, Absent, Failed };
ModelTokenizer load_model_tokenizer(const std::string & gguf, Tokenizer * tok, std::string * err);

// Reads little-endian uint32 ids (no header). Errors: missing file, size not a multiple of 4, an
// id >= n_vocab (naming the id and its position).
bool read_ids_bin(const std::string & path, int64_t n_vocab, std::vector<int32_t> * ids, std::string * err);

// 64-bit hash (FNV-1a style over 8-byte words, then bytes); `h` chains calls.
uint64_t hash64(const void * data, size_t n, uint64_t h = 0xcbf29ce484222325ull);
std::string hex64(uint64_t h);

// Resident memory of this process (from /proc/self/statm), bytes; 0 when unavailable.
size_t rss_bytes();
/// MemAvailable of /proc/meminfo in bytes, else the physical memory; 0 when unknown (train-offload.cpp).
size_t host_available();
/// Bytes of address space this process may still map under RLIMIT_AS (ulimit -v): the limit less VmSize; SIZE_MAX
/// without a limit.
size_t address_space_left();

std::string fmt_bytes(double b);        // "1.23 GiB"
// " | GPU <in use> of <total>" (fmt_bytes) of a backend with device memory (oomb_backend_memory),
// "" for one without (the CPU): the memory field of oomb-train's step and progress lines.
std::string gpu_memory_field(oomb_backend_t be);
std::string fmt_duration(double s);     // "1h02m", "3m05s", "12s"

// The backend of `device` ("cpu" or "cuda"); NULL with *err when unavailable.
oomb_backend_t make_backend(const std::string & device, int n_threads, std::string * err);

// Loss curve: train losses (step, loss) as a line, eval losses as dots; axes with ticks and
// labels. Written with stb_image_write (PNG). false + *err on error.
struct CurvePoint { double step, loss; };
bool write_loss_png(const std::string & path, const std::vector<CurvePoint> & train, const std::vector<CurvePoint> & eval,
                    const std::string & title, std::string * err);

// Writes `data` to `path` atomically (temp file in the same folder, fsync, rename).
bool write_file_atomic(const std::string & path, const std::string & data, std::string * err);

} // namespace train
} // namespace oomb
