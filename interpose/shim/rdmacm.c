/* libshunt-rdmacm.so: no code of its own. Its dependencies are libshunt.so,
 * then librdmacm.so.1, in that order, so dlsym/dlvsym through a handle on
 * it find libshunt's rdma_* wrappers first and librdmacm for every other
 * name and version node. libshunt answers a program's dlopen of librdmacm
 * with such a handle (interpose/verbs/dlopen_exports.cc). */
