// The dev studies' host helpers, for standalone programs without the
// runner: CHECK, the CUDA runtime error check (a failed call prints where
// and why, then exits), and asked_for, which versions the command line
// names.
#pragma once
#include <cuda_runtime.h>

#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#define CHECK(x)                                                                                 \
  do {                                                                                           \
    cudaError_t e_ = (x);                                                                        \
    if (e_ != cudaSuccess) {                                                                     \
      std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      std::exit(1);                                                                              \
    }                                                                                            \
  } while (0)

// Whether the version `name` was asked for on the command line: no names
// (arguments from `first` on) asks for every version, else an argument that
// is its start up to a word's end ("v1" asks for "v1 megakernel ..." but
// not for "v10 ...", "B1" for "B1 hold 2" but not for "B13 ...", "v4 U2"
// for "v4 U2, bulk 8 ahead").
inline bool asked_for(const char* name, int argc, char** argv, int first) {
  bool wanted = argc <= first;
  for (int i = first; i < argc; ++i) {
    const size_t n = std::strlen(argv[i]);
    const bool word_ends = name[n] == '\0' || !std::isalnum(static_cast<unsigned char>(name[n]));
    wanted = wanted || (std::strncmp(name, argv[i], n) == 0 && word_ends);
  }
  return wanted;
}
