// Test-only LD_PRELOAD shim (never linked into a shipped binary): kills the process with SIGKILL
// at a real point of a checkpoint save, to test that an interrupted save leaves the previous
// checkpoint loadable (tests/py/test_train_cli.py).
//
//   OOMB_KILL_ON_RENAME=<name>:<n>   the n-th call (1-based) of rename() whose source file is named
//                                    <name> (the last path component) raises SIGKILL before the
//                                    file is renamed; every other call is libc's rename().
//
// E.g. "model.gguf.saving:2": during the second save, with the new model and state complete under
// their temporary names, before the first rename; "state.safetensors.saving:2": between the two
// renames (the new model is in place, its state still under the temporary name).
#define _GNU_SOURCE
#include <dlfcn.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int rename(const char * oldpath, const char * newpath) {
    static int (*real_rename)(const char *, const char *) = NULL;
    static int seen = 0;
    if (!real_rename) real_rename = (int (*)(const char *, const char *)) dlsym(RTLD_NEXT, "rename");
    const char * spec = getenv("OOMB_KILL_ON_RENAME");
    const char * colon = spec ? strrchr(spec, ':') : NULL;
    if (colon && oldpath) {
        const char * base = strrchr(oldpath, '/');
        base = base ? base + 1 : oldpath;
        if (strlen(base) == (size_t) (colon - spec) && strncmp(base, spec, (size_t) (colon - spec)) == 0 && ++seen == atoi(colon + 1)) {
            fflush(NULL);
            raise(SIGKILL);
        }
    }
    return real_rename(oldpath, newpath);
}
