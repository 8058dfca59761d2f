// Top-k expert selection that orders equal values exactly as PyTorch's CPU
// top-k does (libstdc++ nth_element, then a sort of the first k-1, comparing
// values only). bf16 router logits tie often; the golden vectors were made
// this way, so the oracle and every kernel must select alike. Plain C++ with
// no library calls: the same code runs in the host kernels and on the GPU.
#pragma once

#if defined(__CUDACC__)
#define KT_HD __host__ __device__
#else
#define KT_HD
#endif

namespace ktune::kimi::topk_detail {

struct Item {
  float v;
  int i;
};

KT_HD inline bool greater(const Item& a, const Item& b) { return a.v > b.v; }
KT_HD inline void swap_items(Item* a, Item* b) {
  Item t = *a;
  *a = *b;
  *b = t;
}

KT_HD inline void insertion_sort(Item* first, Item* last) {
  if (first == last) return;
  for (Item* i = first + 1; i != last; ++i) {
    Item val = *i;
    if (greater(val, *first)) {
      for (Item* p = i; p != first; --p) *p = *(p - 1);
      *first = val;
    } else {
      Item* hole = i;
      Item* next = i - 1;
      while (greater(val, *next)) {
        *hole = *next;
        hole = next;
        --next;
      }
      *hole = val;
    }
  }
}

KT_HD inline void move_median_to_first(Item* result, Item* a, Item* b, Item* c) {
  if (greater(*a, *b)) {
    if (greater(*b, *c)) swap_items(result, b);
    else if (greater(*a, *c)) swap_items(result, c);
    else swap_items(result, a);
  } else if (greater(*a, *c)) {
    swap_items(result, a);
  } else if (greater(*b, *c)) {
    swap_items(result, c);
  } else {
    swap_items(result, b);
  }
}

KT_HD inline Item* unguarded_partition(Item* first, Item* last, Item* pivot) {
  while (true) {
    while (greater(*first, *pivot)) ++first;
    --last;
    while (greater(*pivot, *last)) --last;
    if (!(first < last)) return first;
    swap_items(first, last);
    ++first;
  }
}

// Heap helpers for the depth-limit fallback (std::__heap_select), with the
// comparator `greater`, i.e. a heap whose top is the smallest value.
KT_HD inline void adjust_heap(Item* first, long hole, long len, Item value) {
  const long top = hole;
  long child = hole;
  while (child < (len - 1) / 2) {
    child = 2 * (child + 1);
    if (greater(first[child], first[child - 1])) child--;
    first[hole] = first[child];
    hole = child;
  }
  if ((len & 1) == 0 && child == (len - 2) / 2) {
    child = 2 * (child + 1);
    first[hole] = first[child - 1];
    hole = child - 1;
  }
  long parent = (hole - 1) / 2;
  while (hole > top && greater(first[parent], value)) {
    first[hole] = first[parent];
    hole = parent;
    parent = (hole - 1) / 2;
  }
  first[hole] = value;
}

KT_HD inline void make_heap(Item* first, Item* last) {
  long len = last - first;
  if (len < 2) return;
  for (long parent = (len - 2) / 2;; --parent) {
    adjust_heap(first, parent, len, first[parent]);
    if (parent == 0) return;
  }
}

KT_HD inline void heap_select(Item* first, Item* middle, Item* last) {
  make_heap(first, middle);
  for (Item* i = middle; i < last; ++i)
    if (greater(*i, *first)) {
      Item value = *i;
      *i = *first;
      adjust_heap(first, 0, middle - first, value);
    }
}

KT_HD inline int lg(long n) {
  int r = 0;
  while (n > 1) {
    n >>= 1;
    ++r;
  }
  return r;
}

KT_HD inline void nth_element(Item* first, Item* nth, Item* last) {
  if (first == last || nth == last) return;
  int depth = 2 * lg(last - first);
  while (last - first > 3) {
    if (depth == 0) {
      heap_select(first, nth + 1, last);
      swap_items(first, nth);
      return;
    }
    --depth;
    Item* mid = first + (last - first) / 2;
    move_median_to_first(first, first + 1, mid, last - 1);
    Item* cut = unguarded_partition(first + 1, last, first);
    if (cut <= nth) first = cut;
    else last = cut;
  }
  insertion_sort(first, last);
}

}  // namespace ktune::kimi::topk_detail

namespace ktune::kimi {

// Writes the indices of the k largest of values[0..n) to out[0..k), in
// PyTorch's CPU order. `scratch` holds n items. n <= a few hundred.
KT_HD inline void torch_topk(const float* values, int n, int k, int* out, topk_detail::Item* scratch) {
  using namespace topk_detail;
  for (int j = 0; j < n; ++j) scratch[j] = Item{values[j], j};
  nth_element(scratch, scratch + (k - 1), scratch + n);
  // std::sort on k-1 <= 16 elements is an insertion sort.
  insertion_sort(scratch, scratch + (k - 1));
  for (int j = 0; j < k; ++j) out[j] = scratch[j].i;
}

}  // namespace ktune::kimi
