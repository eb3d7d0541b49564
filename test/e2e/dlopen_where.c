/* Opens a library and tells where its symbols come from.
 * Usage: dlopen_where [--first LIB] [--base|--lm] FILE [SYMBOL VERSION]...
 * --first LIB  dlopen LIB (RTLD_NOW|RTLD_GLOBAL) before anything else
 * --base       open through dlopen at glibc's first version, as programs
 *              built before glibc 2.34 do (x86_64 only)
 * --lm         open through dlmopen(LM_ID_BASE, ...)
 * Prints "SYMBOL VERSION OBJECT" for each pair (VERSION "-": dlsym), OBJECT
 * being the real path of the object that defines the address returned, or
 * "-" when none; then closes the handle. Exit 1 when the open fails. */
#include <dlfcn.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__)
void* dlopen_base(const char*, int);
__asm__(".symver dlopen_base, dlopen@GLIBC_2.2.5");
#endif

int main(int argc, char** argv) {
  int i = 1, how = 0;
  if (i + 1 < argc && strcmp(argv[i], "--first") == 0) {
    if (!dlopen(argv[i + 1], RTLD_NOW | RTLD_GLOBAL)) {
      fprintf(stderr, "dlopen %s: %s\n", argv[i + 1], dlerror());
      return 1;
    }
    i += 2;
  }
  if (i < argc && strcmp(argv[i], "--base") == 0)
    how = 1, i++;
  else if (i < argc && strcmp(argv[i], "--lm") == 0)
    how = 2, i++;
  if (i >= argc) {
    fprintf(stderr, "usage: %s [--first LIB] [--base|--lm] FILE [SYMBOL VERSION]...\n", argv[0]);
    return 2;
  }
  const char* file = argv[i++];
  void* h = NULL;
  if (how == 0) h = dlopen(file, RTLD_NOW);
  if (how == 2) h = dlmopen(LM_ID_BASE, file, RTLD_NOW);
#if defined(__x86_64__)
  if (how == 1) h = dlopen_base(file, RTLD_NOW);
#else
  if (how == 1) {
    fprintf(stderr, "--base: x86_64 only\n");
    return 77;
  }
#endif
  if (!h) {
    fprintf(stderr, "dlopen %s: %s\n", file, dlerror());
    return 1;
  }
  for (; i + 1 < argc; i += 2) {
    const char *sym = argv[i], *ver = argv[i + 1];
    void* p = strcmp(ver, "-") == 0 ? dlsym(h, sym) : dlvsym(h, sym, ver);
    Dl_info info;
    char path[PATH_MAX];
    const char* obj = "-";
    if (p && dladdr(p, &info) && info.dli_fname)
      obj = realpath(info.dli_fname, path) ? path : info.dli_fname;
    printf("%s %s %s\n", sym, ver, obj);
  }
  if (dlclose(h) != 0) {
    fprintf(stderr, "dlclose: %s\n", dlerror());
    return 1;
  }
  return 0;
}
