/* Preloaded before libshunt.so: every destructor libshunt registers to run
 * at exit (__cxa_atexit, whose third argument names the registering shared
 * object) is printed as "atexit FUNC_OFFSET OBJECT_OFFSET" (hex, from
 * libshunt's load address), then registered as usual. */
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

typedef int (*cxa_atexit_fn)(void (*)(void*), void*, void*);

int __cxa_atexit(void (*f)(void*), void* arg, void* dso) {
  static cxa_atexit_fn real;
  if (!real) real = (cxa_atexit_fn)dlsym(RTLD_NEXT, "__cxa_atexit");
  Dl_info d;
  if (dso && dladdr(dso, &d) && d.dli_fname && strstr(d.dli_fname, "libshunt.so")) {
    char* base = (char*)d.dli_fbase;
    fprintf(stderr, "atexit %lx %lx\n", (unsigned long)((char*)(void*)f - base),
            (unsigned long)((char*)arg - base));
  }
  return real(f, arg, dso);
}
