// dlopen/dlmopen: programs that load verbs by name (NCCL before 2.30, RCCL,
// TensorPipe: dlopen("libibverbs.so[.1]") then dlvsym(h, "ibv_*", ...)) would
// look symbols up in libibverbs alone and never reach a wrapper. An open of
// the libibverbs libshunt runs on, by any of its names or its path, returns a
// handle on libshunt instead: dlsym/dlvsym through it find libshunt's wrappers
// first and, among libshunt's own dependencies, the real libibverbs for every
// name and version node libshunt does not define. Every other open is a tail
// call to the real one, which therefore still sees the caller's return
// address (its RUNPATH, $ORIGIN and namespace), as without libshunt.
#include <dlfcn.h>
#include <link.h>
#include <string.h>

#include "interpose/core/log.h"
#include "interpose/core/runtime.h"

using namespace shunt;

namespace {

char g_pass_tag;
void* const kPass = &g_pass_tag;  // "not ours": the caller does the real open

// The basename is libibverbs.so, libibverbs.so.1 or the versioned file name.
inline bool names_verbs(const char* file) {
  if (!file) return false;
  const char* base = strrchr(file, '/');
  base = base ? base + 1 : file;
  static constexpr char kName[] = "libibverbs.so";
  if (strncmp(base, kName, sizeof kName - 1) != 0) return false;
  char next = base[sizeof kName - 1];
  return next == '\0' || next == '.';
}

link_map* map_of(const void* addr) {
  Dl_info info;
  link_map* map = nullptr;
  if (!dladdr1(addr, &info, reinterpret_cast<void**>(&map), RTLD_DL_LINKMAP)) return nullptr;
  return map;
}

link_map* self_map() {
  static link_map* const map = map_of(reinterpret_cast<const void*>(&map_of));
  return map;
}

// The libibverbs object libshunt's wrappers call into.
link_map* verbs_map() {
  void* real = dlvsym(RTLD_NEXT, "ibv_get_device_list", "IBVERBS_1.1");
  return real ? map_of(real) : nullptr;
}

// The open of a name that passed names_verbs: libshunt's handle when `file`
// is the libibverbs shunt wraps, the real handle when it is another copy,
// else kPass.
__attribute__((noinline)) void* open_verbs(const char* file, int mode, const void* caller,
                                           void* (*real_open)(const char*, int) noexcept) {
  if (in_shunt() || !self_map() || map_of(caller) == self_map()) return kPass;
  ensure_init();
  if (current_mode() == Mode::off) return kPass;
  ReentryGuard g;
  // From here the loader searches as from libshunt; a name only the caller's
  // RUNPATH finds fails here, and is then opened by the caller as it asked.
  void* h = real_open(file, mode);
  if (!h) return kPass;
  link_map* opened = nullptr;
  if (dlinfo(h, RTLD_DI_LINKMAP, &opened) != 0 || opened != verbs_map())
    return h;  // another copy: untouched
  // NOLOAD takes a reference on libshunt, which the caller's dlclose gives
  // back; libibverbs stays loaded as libshunt's dependency.
  void* self = real_open(self_map()->l_name, RTLD_LAZY | RTLD_NOLOAD);
  if (!self) return h;
  dlclose(h);
  try {
    log::once(
        LogLevel::info, "dlopen-verbs",
        fmt::format("dlopen(\"{}\") answered by libshunt: verbs looked up through it reach shunt",
                    file));
  } catch (...) {
  }
  return self;
}

}  // namespace

extern "C" {

// dlopen at glibc's default version and, for programs and libraries built
// against glibc before 2.34 (NCCL as pip ships it), at the architecture's
// first one: one entry, named by .symver since the version script cannot
// give one name two nodes.
__attribute__((visibility("default"))) void* shunt_dlopen(const char* file, int mode) noexcept {
  static std::atomic<void*> slot{nullptr};
  auto* real = real_fn<void*(const char*, int) noexcept>(slot, "dlopen", "GLIBC_2.34", "libc.so.6",
                                                         reinterpret_cast<void*>(&shunt_dlopen));
  if (__builtin_expect(names_verbs(file), 0)) {
    void* h = open_verbs(file, mode, __builtin_return_address(0), real);
    if (h != kPass) return h;
  }
  return real(file, mode);  // a tail call: the caller's address is the one glibc sees
}
__asm__(".symver shunt_dlopen, dlopen@@GLIBC_2.34");
#if defined(__x86_64__)
__attribute__((visibility("default"), alias("shunt_dlopen"))) void* shunt_dlopen_base(const char*,
                                                                                      int) noexcept;
__asm__(".symver shunt_dlopen_base, dlopen@GLIBC_2.2.5");
#elif defined(__aarch64__)
__attribute__((visibility("default"), alias("shunt_dlopen"))) void* shunt_dlopen_base(const char*,
                                                                                      int) noexcept;
__asm__(".symver shunt_dlopen_base, dlopen@GLIBC_2.17");
#endif

// Only the base namespace holds libshunt; opens into another pass through.
__attribute__((visibility("default"))) void* dlmopen(Lmid_t ns, const char* file, int mode) {
  if (__builtin_expect(ns == LM_ID_BASE && names_verbs(file), 0)) {
    static std::atomic<void*> slot{nullptr};
    auto* real = real_fn<void*(const char*, int) noexcept>(
        slot, "dlopen", "GLIBC_2.34", "libc.so.6", reinterpret_cast<void*>(&shunt_dlopen));
    void* h = open_verbs(file, mode, __builtin_return_address(0), real);
    if (h != kPass) return h;
  }
  return SHUNT_REAL_IN("libc.so.6", dlmopen, "GLIBC_2.34")(ns, file, mode);
}

}  // extern "C"
