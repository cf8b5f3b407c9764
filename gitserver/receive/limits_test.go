package receive

import (
	"bytes"
	"compress/zlib"
	"context"
	"crypto/sha1"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/go-git/go-git/v5/plumbing"
)

// packEntry is one hand-made entry: a type and declared size, then the zlib
// stream of data (which need not have that size).
type packEntry struct {
	typ  byte
	size int64
	data io.Reader
	pre  []byte // after the header, before the zlib stream (a delta's base)
}

// craftPack writes a pack with the given entries and a correct trailer.
func craftPack(t testing.TB, entries ...packEntry) []byte {
	t.Helper()
	var b bytes.Buffer
	b.WriteString("PACK")
	binary.Write(&b, binary.BigEndian, uint32(2))
	binary.Write(&b, binary.BigEndian, uint32(len(entries)))
	for _, e := range entries {
		size := e.size
		c := e.typ<<4 | byte(size&0x0f)
		size >>= 4
		for size > 0 {
			b.WriteByte(c | 0x80)
			c = byte(size & 0x7f)
			size >>= 7
		}
		b.WriteByte(c)
		b.Write(e.pre)
		zw := zlib.NewWriter(&b)
		if _, err := io.Copy(zw, e.data); err != nil {
			t.Fatal(err)
		}
		zw.Close()
	}
	sum := sha1.Sum(b.Bytes())
	b.Write(sum[:])
	return b.Bytes()
}

// zeros is n zero bytes, generated as read.
type zeros struct{ n int64 }

func (z *zeros) Read(p []byte) (int, error) {
	if z.n == 0 {
		return 0, io.EOF
	}
	if int64(len(p)) > z.n {
		p = p[:z.n]
	}
	clear(p)
	z.n -= int64(len(p))
	return len(p), nil
}

func emptyRepo(t testing.TB) *Repo {
	t.Helper()
	repo, err := Init(filepath.Join(t.TempDir(), "app.git"), "main")
	if err != nil {
		t.Fatal(err)
	}
	return repo
}

func noPacksLeft(t *testing.T, repo *Repo) {
	t.Helper()
	if left, _ := filepath.Glob(filepath.Join(repo.Dir, "objects/pack/*")); len(left) != 0 {
		t.Fatalf("files left behind: %v", left)
	}
}

func TestDeclaredSizesAreCheckedAndNeverExceeded(t *testing.T) {
	const limit = 1 << 20
	cases := map[string]struct {
		pack []byte
		want string
	}{
		// The header says a gigabyte; the stream holds ten bytes.
		"declares more than it holds": {craftPack(t, packEntry{typ: typeBlob, size: 1 << 30, data: strings.NewReader("0123456789")}), "inflates to 10 bytes, not the 1073741824"},
		// A zlib bomb: 64 MiB of zeros in about 64 KiB, declared as ten bytes.
		"holds more than it declares": {craftPack(t, packEntry{typ: typeBlob, size: 10, data: &zeros{64 << 20}}), "inflates to more than the 10 bytes"},
		"a commit bomb":               {craftPack(t, packEntry{typ: typeCommit, size: 100, data: &zeros{64 << 20}}), "inflates to more than the 100 bytes"},
		"a delta bomb":                {craftPack(t, packEntry{typ: typeRefDelta, size: 12, pre: make([]byte, 20), data: &zeros{64 << 20}}), "inflates to more than the 12 bytes"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			repo := emptyRepo(t)
			_, err := repo.StorePack(context.Background(), bytes.NewReader(tc.pack), Limits{MaxObjectBytes: limit})
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("want an error containing %q, got %v", tc.want, err)
			}
			noPacksLeft(t, repo)
		})
	}
}

func TestObjectsOverTheLimitAreRefusedWithTheirPath(t *testing.T) {
	src := t.TempDir()
	git(t, src, "init", "-q", "-b", "main")
	if err := os.MkdirAll(filepath.Join(src, "assets"), 0o755); err != nil {
		t.Fatal(err)
	}
	big := bytes.Repeat([]byte("0123456789abcdef"), 1<<16) // 1 MiB
	if err := os.WriteFile(filepath.Join(src, "assets", "big.bin"), big, 0o644); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(src, "small.txt"), []byte("small\n"), 0o644)
	git(t, src, "add", ".")
	git(t, src, "commit", "-q", "-m", "big")
	tip := plumbing.NewHash(git(t, src, "rev-parse", "HEAD"))
	repo := emptyRepo(t)
	_, err := repo.StorePack(context.Background(), bytes.NewReader(packOf(t, src, false, "main")), Limits{MaxObjectBytes: 512 << 10, Tips: []plumbing.Hash{tip}})
	var tl *TooLargeError
	if !errors.As(err, &tl) || err.Error() != "assets/big.bin is 1.0 MiB, more than the limit of 512 KiB per file" {
		t.Fatalf("got %v", err)
	}
	noPacksLeft(t, repo)

	// The same objects under a limit they fit.
	if _, err := repo.StorePack(context.Background(), bytes.NewReader(packOf(t, src, false, "main")), Limits{MaxObjectBytes: 1 << 20, Tips: []plumbing.Hash{tip}}); err != nil {
		t.Fatal(err)
	}
}

func TestADeltaWhoseResultIsOverTheLimitIsRefused(t *testing.T) {
	src := workTree(t, 3) // file.txt, about 17 KiB, as deltas
	repo := emptyRepo(t)
	_, err := repo.StorePack(context.Background(), bytes.NewReader(packOf(t, src, false, "main")), Limits{MaxObjectBytes: 16 << 10})
	var tl *TooLargeError
	if !errors.As(err, &tl) || !strings.Contains(err.Error(), "more than the limit of 16 KiB per file") {
		t.Fatalf("got %v", err)
	}
}

// FuzzStorePack: whatever the pack holds, StorePack refuses or stores it, never
// panics, and stores nothing it refused. Seeds: a real pack with deltas and a
// hand-made one.
func FuzzStorePack(f *testing.F) {
	src := workTree(f, 3)
	f.Add(packOf(f, src, false, "main"))
	f.Add(craftPack(f, packEntry{typ: typeBlob, size: 10, data: strings.NewReader("0123456789")}))
	f.Fuzz(func(t *testing.T, data []byte) {
		repo, err := Init(filepath.Join(t.TempDir(), "app.git"), "main")
		if err != nil {
			t.Fatal(err)
		}
		done := make(chan struct{})
		go func() {
			select {
			case <-done:
			case <-time.After(10 * time.Second):
				buf := make([]byte, 1<<20)
				panic("StorePack hangs:\n" + string(buf[:runtime.Stack(buf, true)]))
			}
		}()
		_, err = repo.StorePack(context.Background(), bytes.NewReader(data), Limits{MaxObjectBytes: 1 << 20, MaxPackBytes: 1 << 20})
		close(done)
		if err != nil {
			noPacksLeft(t, repo)
		}
	})
}

// headerOnly hands out a pack's 12-byte header, then fails: whatever reads
// further has read into the objects.
type headerOnly struct {
	hdr  []byte
	read bool
}

func (h *headerOnly) Read(p []byte) (int, error) {
	if h.read {
		return 0, errors.New("read past the pack's header")
	}
	h.read = true
	return copy(p, h.hdr[:12]), nil
}

func TestTooManyObjectsAreRefusedFromThePackHeader(t *testing.T) {
	src := workTree(t, 3) // 9 objects
	pack := packOf(t, src, false, "main")
	count := int64(binary.BigEndian.Uint32(pack[8:12]))
	repo := emptyRepo(t)
	// Nothing past the header is read: no object is inflated, nor even received.
	_, err := repo.StorePack(context.Background(), &headerOnly{hdr: pack}, Limits{MaxObjects: count - 1})
	var many *TooManyObjectsError
	want := fmt.Sprintf("the push holds %d objects, more than the limit of %d per push", count, count-1)
	if !errors.As(err, &many) || err.Error() != want {
		t.Fatalf("got %v, want %q", err, want)
	}
	noPacksLeft(t, repo)

	// A header announcing four billion objects costs nothing either.
	huge := bytes.Clone(pack[:12])
	binary.BigEndian.PutUint32(huge[8:], 4_000_000_000)
	_, err = repo.StorePack(context.Background(), &headerOnly{hdr: huge}, Limits{})
	if !errors.As(err, &many) || err.Error() != "the push holds 4,000,000,000 objects, more than the limit of 2,000,000 per push" {
		t.Fatalf("got %v", err)
	}
	noPacksLeft(t, repo)

	// The same pack at the limit is stored.
	p, err := repo.StorePack(context.Background(), bytes.NewReader(pack), Limits{MaxObjects: count})
	if err != nil || int64(p.Objects) != count {
		t.Fatalf("at the limit: %+v, %v", p, err)
	}
}

func TestThousands(t *testing.T) {
	for n, want := range map[int64]string{0: "0", 999: "999", 1000: "1,000", 2_000_000: "2,000,000", 4_294_967_295: "4,294,967,295", -1234: "-1,234"} {
		if got := thousands(n); got != want {
			t.Errorf("thousands(%d) = %q, want %q", n, got, want)
		}
	}
}
