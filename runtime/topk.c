/*
 * topk.c — the k largest of n floats in the order torch.topk returns them
 * on the CPU, ties included: the order Mixtral's router picks experts in.
 *
 * Why not "lowest index first": PyTorch's CPU topk (aten TopKImpl.h) puts
 * (value, index) pairs in an array and calls the C++ library's selection
 * algorithms with "a before b when a is NaN and b is not, or a > b", which
 * leaves equal values in whatever order the algorithm moves them to:
 *   k * 64 <= n:  std::partial_sort(first k)            (heap select, then heap sort)
 *   otherwise:    std::nth_element(k-1), then std::sort(first k-1)
 * torch.topk([0.25] * 8, 2) is [6, 5]. PyTorch's Linux wheels use GCC's
 * libstdc++, so this file carries the same algorithms written out in C (the
 * introselect of nth_element: median-of-three pivot, Hoare partition,
 * insertion sort below 4 elements, heap select past its depth limit; the
 * introsort of sort: the same partition down to 16 elements, then insertion
 * sort; the binary heap of partial_sort). Every step must move elements
 * exactly as there, or ties come out in another order: tests/test_golden.c
 * checks this file against torch.topk over inputs full of ties
 * (tests/golden/topk-ties, made by make_goldens.py).
 */
#include <math.h>
#include <stdlib.h>

#include "kiln_rt.h"

typedef struct tk_elem {
    float v;
    int32_t i;
} tk_elem;

/* torch's comparator: a goes before b. */
static int before(tk_elem a, tk_elem b) { return (isnan(a.v) && !isnan(b.v)) || a.v > b.v; }

static void swap(tk_elem *a, tk_elem *b) {
    tk_elem t = *a;
    *a = *b;
    *b = t;
}

static int floor_log2(ptrdiff_t n) {
    int k = 0;
    while (n > 1) {
        n >>= 1;
        k++;
    }
    return k;
}

/* ---- binary heap (the "largest" at the top is the element every other goes after) ---- */

static void push_heap(tk_elem *first, ptrdiff_t hole, ptrdiff_t top, tk_elem val) {
    ptrdiff_t parent = (hole - 1) / 2;
    while (hole > top && before(first[parent], val)) {
        first[hole] = first[parent];
        hole = parent;
        parent = (hole - 1) / 2;
    }
    first[hole] = val;
}

static void adjust_heap(tk_elem *first, ptrdiff_t hole, ptrdiff_t len, tk_elem val) {
    const ptrdiff_t top = hole;
    ptrdiff_t child = hole;
    while (child < (len - 1) / 2) {
        child = 2 * (child + 1);
        if (before(first[child], first[child - 1])) child--;
        first[hole] = first[child];
        hole = child;
    }
    if ((len & 1) == 0 && child == (len - 2) / 2) {
        child = 2 * (child + 1);
        first[hole] = first[child - 1];
        hole = child - 1;
    }
    push_heap(first, hole, top, val);
}

static void make_heap(tk_elem *first, tk_elem *last) {
    ptrdiff_t len = last - first;
    if (len < 2) return;
    for (ptrdiff_t parent = (len - 2) / 2;; parent--) {
        adjust_heap(first, parent, len, first[parent]);
        if (parent == 0) return;
    }
}

/* Move the top to *result and put *result's old value into the heap [first, last). */
static void pop_heap(tk_elem *first, tk_elem *last, tk_elem *result) {
    tk_elem val = *result;
    *result = *first;
    adjust_heap(first, 0, last - first, val);
}

static void heap_select(tk_elem *first, tk_elem *middle, tk_elem *last) {
    make_heap(first, middle);
    for (tk_elem *i = middle; i < last; i++)
        if (before(*i, *first)) pop_heap(first, middle, i);
}

static void sort_heap(tk_elem *first, tk_elem *last) {
    while (last - first > 1) {
        last--;
        pop_heap(first, last, last);
    }
}

static void partial_sort(tk_elem *first, tk_elem *middle, tk_elem *last) {
    heap_select(first, middle, last);
    sort_heap(first, middle);
}

/* ---- partitioning and insertion sort ---- */

static void move_median_to_first(tk_elem *result, tk_elem *a, tk_elem *b, tk_elem *c) {
    if (before(*a, *b)) {
        if (before(*b, *c)) swap(result, b);
        else if (before(*a, *c)) swap(result, c);
        else swap(result, a);
    } else if (before(*a, *c)) {
        swap(result, a);
    } else if (before(*b, *c)) {
        swap(result, c);
    } else {
        swap(result, b);
    }
}

static tk_elem *unguarded_partition(tk_elem *first, tk_elem *last, const tk_elem *pivot) {
    for (;;) {
        while (before(*first, *pivot)) first++;
        last--;
        while (before(*pivot, *last)) last--;
        if (!(first < last)) return first;
        swap(first, last);
        first++;
    }
}

static tk_elem *unguarded_partition_pivot(tk_elem *first, tk_elem *last) {
    tk_elem *mid = first + (last - first) / 2;
    move_median_to_first(first, first + 1, mid, last - 1);
    return unguarded_partition(first + 1, last, first);
}

static void unguarded_linear_insert(tk_elem *last) {
    tk_elem val = *last;
    tk_elem *next = last - 1;
    while (before(val, *next)) {
        *last = *next;
        last = next;
        next--;
    }
    *last = val;
}

static void insertion_sort(tk_elem *first, tk_elem *last) {
    if (first == last) return;
    for (tk_elem *i = first + 1; i != last; i++) {
        if (before(*i, *first)) {
            tk_elem val = *i;
            for (tk_elem *p = i; p != first; p--) p[0] = p[-1];
            *first = val;
        } else {
            unguarded_linear_insert(i);
        }
    }
}

/* ---- nth_element and sort ---- */

static void nth_element(tk_elem *first, tk_elem *nth, tk_elem *last) {
    if (first == last || nth == last) return;
    int depth = floor_log2(last - first) * 2;
    while (last - first > 3) {
        if (depth == 0) {
            heap_select(first, nth + 1, last);
            swap(first, nth); /* the nth element in its place */
            return;
        }
        depth--;
        tk_elem *cut = unguarded_partition_pivot(first, last);
        if (cut <= nth) first = cut;
        else last = cut;
    }
    insertion_sort(first, last);
}

enum { TK_THRESHOLD = 16 };

static void introsort_loop(tk_elem *first, tk_elem *last, int depth) {
    while (last - first > TK_THRESHOLD) {
        if (depth == 0) {
            partial_sort(first, last, last);
            return;
        }
        depth--;
        tk_elem *cut = unguarded_partition_pivot(first, last);
        introsort_loop(cut, last, depth);
        last = cut;
    }
}

static void sort(tk_elem *first, tk_elem *last) {
    if (first == last) return;
    introsort_loop(first, last, floor_log2(last - first) * 2);
    if (last - first > TK_THRESHOLD) {
        insertion_sort(first, first + TK_THRESHOLD);
        for (tk_elem *i = first + TK_THRESHOLD; i != last; i++) unguarded_linear_insert(i);
    } else {
        insertion_sort(first, last);
    }
}

kiln_status kiln_topk(const float *v, int n, int k, int32_t *idx, kiln_error *err) {
    if (n <= 0 || k <= 0 || k > n) return kiln_err(err, KILN_ERR_INVALID_ARG, "topk: %d of %d values", k, n);
    tk_elem local[512]; /* a router's experts fit */
    tk_elem *q = n <= 512 ? local : malloc((size_t)n * sizeof *q);
    if (!q) return kiln_err(err, KILN_ERR_NOMEM, "topk: out of memory");
    for (int j = 0; j < n; j++) q[j] = (tk_elem){v[j], j};
    if ((int64_t)k * 64 <= n) {
        partial_sort(q, q + k, q + n);
    } else {
        nth_element(q, q + k - 1, q + n);
        sort(q, q + k - 1);
    }
    for (int j = 0; j < k; j++) idx[j] = q[j].i;
    if (q != local) free(q);
    return KILN_OK;
}
