// dlopen/dlmopen: programs that load verbs by name (NCCL before 2.30, RCCL,
// TensorPipe: dlopen("libibverbs.so[.1]") then dlvsym(h, "ibv_*", ...)) would
// look symbols up in libibverbs alone and never reach a wrapper. An open of
// the libibverbs libshunt runs on, by any of its names or its path, returns a
// handle on libshunt instead: dlsym/dlvsym through it find libshunt's wrappers
// first and, among libshunt's own dependencies, the real libibverbs for every
// name and version node libshunt does not define. librdmacm is not among those
// dependencies (libshunt would load it into every process), so an open of
// librdmacm returns a handle on libshunt-rdmacm.so, installed beside libshunt:
// an empty object whose dependencies are libshunt, then librdmacm, so a lookup
// through it finds libshunt's rdma_* wrappers first and librdmacm for the
// rest. Every other open is a tail call to the real one, which therefore
// still sees the caller's return address (its RUNPATH, $ORIGIN and
// namespace), as without libshunt.
#include <dlfcn.h>
#include <link.h>
#include <string.h>

#include "core/log.h"
#include "core/runtime.h"

using namespace shunt;

namespace {

char g_pass_tag;
void* const kPass = &g_pass_tag;  // "not ours": the caller does the real open

// The basename is NAME (e.g. "libibverbs.so") or NAME.SUFFIX.
inline bool names_lib(const char* file, const char* name, size_t len) {
  if (!file) return false;
  const char* base = strrchr(file, '/');
  base = base ? base + 1 : file;
  if (strncmp(base, name, len) != 0) return false;
  return base[len] == '\0' || base[len] == '.';
}
constexpr char kVerbs[] = "libibverbs.so";
constexpr char kRdmacm[] = "librdmacm.so";
enum class Lib { other, verbs, rdmacm };
inline Lib which_lib(const char* file) {
  if (names_lib(file, kVerbs, sizeof kVerbs - 1)) return Lib::verbs;
  if (names_lib(file, kRdmacm, sizeof kRdmacm - 1)) return Lib::rdmacm;
  return Lib::other;
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

// libshunt-rdmacm.so beside libshunt ("" when libshunt's path is unknown or
// too long); built once, with no allocation (dlopen is noexcept).
const char* rdmacm_shim_path() {
  static const struct Path {
    char s[4096] = "";
    Path() {
      const char* self = self_map() ? self_map()->l_name : nullptr;
      const char* slash = self ? strrchr(self, '/') : nullptr;
      static constexpr char kShim[] = "libshunt-rdmacm.so";
      const size_t dir = slash ? static_cast<size_t>(slash - self) + 1 : 0;
      if (dir == 0 || dir + sizeof kShim > sizeof s) return;
      memcpy(s, self, dir);
      memcpy(s + dir, kShim, sizeof kShim);
    }
  } path;
  return path.s;
}

// librdmacm, opened as `h`: the shim's handle when the shim's librdmacm is
// the same object, else `h`.
void* answer_rdmacm(const char* file, int mode, void* h, void* (*real_open)(const char*, int) noexcept) {
  const char* shim_path = rdmacm_shim_path();
  void* shim = *shim_path ? real_open(shim_path, mode & ~RTLD_NOLOAD) : nullptr;
  const char* why = nullptr;
  if (!shim) {
    why = "libshunt-rdmacm.so is not beside libshunt";
  } else if (dlvsym(shim, "rdma_create_id", "RDMACM_1.0") != dlvsym(h, "rdma_create_id", "RDMACM_1.0")) {
    why = "it is another copy of librdmacm than the one libshunt wraps";
    dlclose(shim);
    shim = nullptr;
  }
  try {
    if (shim)
      log::once(LogLevel::info, "dlopen-rdmacm",
                fmt::format("dlopen(\"{}\") answered through libshunt: rdma_cm looked up through it reaches shunt",
                            file));
    else
      log::once(LogLevel::warn, "dlopen-rdmacm",
                fmt::format("dlopen(\"{}\") gets the real librdmacm ({}): its disconnects over a dead route wait "
                            "for the connection manager",
                            file, why));
  } catch (...) {
  }
  if (!shim) return h;
  dlclose(h);  // the shim holds librdmacm
  return shim;
}

// The open of a name that which_lib placed: libshunt's handle (verbs) or the
// shim's (rdmacm) when `file` is the library shunt wraps, the real handle
// when it is another copy, else kPass.
__attribute__((noinline)) void* open_wrapped(Lib lib, const char* file, int mode, const void* caller,
                                             void* (*real_open)(const char*, int) noexcept) {
  if (in_shunt() || !self_map() || map_of(caller) == self_map()) return kPass;
  ensure_init();
  if (current_mode() == Mode::off) return kPass;
  ReentryGuard g;
  // From here the loader searches as from libshunt; a name only the caller's
  // RUNPATH finds fails here, and is then opened by the caller as it asked.
  void* h = real_open(file, mode);
  if (!h) return kPass;
  if (lib == Lib::rdmacm) return answer_rdmacm(file, mode, h, real_open);
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
  if (Lib lib = which_lib(file); __builtin_expect(lib != Lib::other, 0)) {
    void* h = open_wrapped(lib, file, mode, __builtin_return_address(0), real);
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
  Lib lib = ns == LM_ID_BASE ? which_lib(file) : Lib::other;
  if (__builtin_expect(lib != Lib::other, 0)) {
    static std::atomic<void*> slot{nullptr};
    auto* real = real_fn<void*(const char*, int) noexcept>(
        slot, "dlopen", "GLIBC_2.34", "libc.so.6", reinterpret_cast<void*>(&shunt_dlopen));
    void* h = open_wrapped(lib, file, mode, __builtin_return_address(0), real);
    if (h != kPass) return h;
  }
  return SHUNT_REAL_IN("libc.so.6", dlmopen, "GLIBC_2.34")(ns, file, mode);
}

}  // extern "C"
