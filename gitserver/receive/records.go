package receive

import (
	"bytes"
	"fmt"
	"sort"

	"golang.org/x/sys/unix"
)

// records is a growable array of fixed-size records in an anonymous memory
// mapping, outside the Go heap. The indexer's tables cost tens of bytes per
// object, tens of MiB for a million objects: on the heap, the garbage collector
// lets the heap grow to twice what is live before it collects (GOGC=100), so each
// live byte would cost two of resident memory, and the heap keeps its high mark
// after the push. Mapped, a byte costs a byte, pages not yet written cost
// nothing, growth moves pages instead of copying them (mremap), and free gives it
// all back at once. Records hold no pointers, so the collector need not see them.
type records struct {
	size int // of one record
	n    int
	mem  []byte
}

// minMapping is the first mapping of a table: a small push touches one page.
const minMapping = 64 << 10

func newRecords(size int) *records { return &records{size: size} }

func (r *records) len() int { return r.n }

// at is record i, its bytes in the table.
func (r *records) at(i int) []byte {
	o := i * r.size
	return r.mem[o : o+r.size : o+r.size]
}

// add appends a record and returns it to be filled in.
func (r *records) add() ([]byte, error) {
	if (r.n+1)*r.size > len(r.mem) {
		if err := r.grow((r.n + 1) * r.size); err != nil {
			return nil, err
		}
	}
	r.n++
	return r.at(r.n - 1), nil
}

// truncate keeps the first n records.
func (r *records) truncate(n int) { r.n = n }

func (r *records) grow(need int) error {
	n := max(minMapping, 2*len(r.mem))
	for n < need {
		n *= 2
	}
	var mem []byte
	var err error
	if r.mem == nil {
		mem, err = unix.Mmap(-1, 0, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_NORESERVE)
	} else {
		mem, err = unix.Mremap(r.mem, n, unix.MREMAP_MAYMOVE)
	}
	if err != nil {
		return fmt.Errorf("mapping %d bytes for the pack's index: %w", n, err)
	}
	r.mem = mem
	return nil
}

// free unmaps the table; it is empty afterwards.
func (r *records) free() {
	if r.mem != nil {
		_ = unix.Munmap(r.mem)
	}
	r.mem, r.n = nil, 0
}

// sortBy sorts the records by less (not stably: make the order total).
func (r *records) sortBy(less func(a, b []byte) bool) {
	sort.Sort(recordSorter{r: r, less: less, tmp: make([]byte, r.size)})
}

type recordSorter struct {
	r    *records
	less func(a, b []byte) bool
	tmp  []byte
}

func (s recordSorter) Len() int           { return s.r.n }
func (s recordSorter) Less(i, j int) bool { return s.less(s.r.at(i), s.r.at(j)) }
func (s recordSorter) Swap(i, j int) {
	a, b := s.r.at(i), s.r.at(j)
	copy(s.tmp, a)
	copy(a, b)
	copy(b, s.tmp)
}

// search is the first record i for which atLeast holds (records sorted so that
// it is false, then true), or len.
func (r *records) search(atLeast func(rec []byte) bool) int {
	return sort.Search(r.n, func(i int) bool { return atLeast(r.at(i)) })
}

// dedup drops the records equal to the one before (on sorted records).
func (r *records) dedup() {
	if r.n == 0 {
		return
	}
	w := 1
	for i := 1; i < r.n; i++ {
		if !bytes.Equal(r.at(i), r.at(w-1)) {
			if w != i {
				copy(r.at(w), r.at(i))
			}
			w++
		}
	}
	r.n = w
}
