package audit

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
)

const (
	segmentPrefix = "audit-"
	segmentSuffix = ".jsonl"
	// tailChunk is how much Open reads at a time from a segment's end: a few
	// lines, so finding the last entry reads one chunk.
	tailChunk = 16 << 10
)

// segmentPath names the segment whose first entry has Seq first: zero-padded
// to the 20 digits of a uint64, so names sort as Seqs do.
func segmentPath(dir string, first uint64) string {
	return filepath.Join(dir, fmt.Sprintf("%s%020d%s", segmentPrefix, first, segmentSuffix))
}

// listSegments returns dir's segments, oldest first; other files are ignored.
func listSegments(dir string) ([]segment, error) {
	des, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("audit: %w", err)
	}
	var segs []segment
	for _, de := range des {
		name := de.Name()
		if !de.Type().IsRegular() || !strings.HasPrefix(name, segmentPrefix) || !strings.HasSuffix(name, segmentSuffix) {
			continue
		}
		n, err := strconv.ParseUint(strings.TrimSuffix(strings.TrimPrefix(name, segmentPrefix), segmentSuffix), 10, 64)
		if err != nil || n == 0 {
			continue
		}
		segs = append(segs, segment{first: n, path: filepath.Join(dir, name)})
	}
	sort.Slice(segs, func(i, j int) bool { return segs[i].first < segs[j].first })
	return segs, nil
}

// createSegment makes the segment starting at first and opens it for
// appending. The directory is synced, so that after a crash of the machine the
// new name (which carries the next Seq) is there.
func createSegment(dir string, first uint64) (*os.File, error) {
	f, err := os.OpenFile(segmentPath(dir, first), os.O_RDWR|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return nil, fmt.Errorf("audit: %w", err)
	}
	if d, err := os.Open(dir); err == nil {
		_ = d.Sync()
		d.Close()
	}
	return f, nil
}

// readSegment reads the first limit bytes of a segment, all of it when limit
// is negative.
func readSegment(path string, limit int64) ([]byte, error) {
	if limit < 0 {
		return os.ReadFile(path)
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return io.ReadAll(io.LimitReader(f, limit))
}

// readLast returns the last entry of the segment at path.
func readLast(path string) (e Entry, end int64, ok bool, err error) {
	f, err := os.Open(path)
	if err != nil {
		return Entry{}, 0, false, fmt.Errorf("audit: %w", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return Entry{}, 0, false, fmt.Errorf("audit: %w", err)
	}
	return lastEntry(f, fi.Size())
}

// lastEntry finds the last line of f's first size bytes that is an entry,
// reading backwards from the end. end is the offset just past that line's
// newline (0 when there is none): what follows it is a torn line, or lines
// that are not entries.
func lastEntry(f io.ReaderAt, size int64) (e Entry, end int64, ok bool, err error) {
	r := &backReader{f: f, pos: size}
	nl, err := r.lastNewline(size)
	if err != nil || nl < 0 {
		return Entry{}, 0, false, err
	}
	for {
		prev, err := r.lastNewline(nl)
		if err != nil {
			return Entry{}, 0, false, err
		}
		start := prev + 1
		if e, ok := decode(r.bytes(start, nl)); ok {
			return e, nl + 1, true, nil
		}
		if prev < 0 {
			return Entry{}, 0, false, nil
		}
		nl = prev
	}
}

// backReader holds the end of a file, read backwards by chunks as needed:
// buf is the file's bytes from pos on.
type backReader struct {
	f   io.ReaderAt
	pos int64
	buf []byte
}

// lastNewline returns the offset of the last newline before off, -1 when
// there is none.
func (r *backReader) lastNewline(off int64) (int64, error) {
	for {
		if off > r.pos {
			if i := bytes.LastIndexByte(r.buf[:off-r.pos], '\n'); i >= 0 {
				return r.pos + int64(i), nil
			}
			off = r.pos
		}
		if r.pos == 0 {
			return -1, nil
		}
		n := min(int64(tailChunk), r.pos)
		b := make([]byte, n+int64(len(r.buf)))
		if _, err := r.f.ReadAt(b[:n], r.pos-n); err != nil {
			return 0, fmt.Errorf("audit: %w", err)
		}
		copy(b[n:], r.buf)
		r.buf, r.pos = b, r.pos-n
	}
}

// bytes returns the file's bytes [from, to), which lastNewline has read.
func (r *backReader) bytes(from, to int64) []byte {
	return r.buf[from-r.pos : to-r.pos]
}
