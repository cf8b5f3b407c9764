package receive

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/debug"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"bex.co/bex/internal/testenv"
	"github.com/go-git/go-git/v5/plumbing"
)

// manySmallObjects is testenv.ManySmallFiles in a directory of its own, returned.
func manySmallObjects(t testing.TB, n int) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "many")
	testenv.ManySmallFiles(t, dir, n)
	return dir
}

// packFile writes the pack that a push of main sends (git pack-objects, as
// send-pack runs it) to a file and returns its path.
func packFile(t testing.TB, dir string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "push.pack")
	out, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	cmd := exec.Command("git", "pack-objects", "--stdout", "--revs", "--delta-base-offset", "-q")
	cmd.Dir = dir
	cmd.Stdin = strings.NewReader("main\n")
	cmd.Stdout = out
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("pack-objects: %v\n%s", err, stderr.String())
	}
	return path
}

// procStatus reads a field of /proc/self/status in bytes (VmRSS, VmHWM).
func procStatus(t testing.TB, field string) int64 {
	t.Helper()
	data, err := os.ReadFile("/proc/self/status")
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.SplitSeq(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, field+":"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			return kb << 10
		}
	}
	t.Fatalf("no %s in /proc/self/status", field)
	return 0
}

// storePeak stores the pack at path into repo and returns how much the
// process's peak resident memory (VmHWM, reset before through clear_refs) rose
// above its resident memory before the store, and how long the store took.
func storePeak(t testing.TB, repo *Repo, path string, lim Limits) (*Pack, int64, time.Duration) {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	debug.FreeOSMemory()
	if err := os.WriteFile("/proc/self/clear_refs", []byte("5"), 0); err != nil {
		t.Fatalf("resetting the peak RSS: %v", err)
	}
	before := procStatus(t, "VmRSS")
	start := time.Now()
	p, err := repo.StorePack(context.Background(), bufio.NewReaderSize(f, 64<<10), lim)
	if err != nil {
		t.Fatal(err)
	}
	return p, procStatus(t, "VmHWM") - before, time.Since(start)
}

// gitIndexPack indexes the pack at path with git index-pack, as git's own
// receive-pack does, and returns the index it wrote, its peak resident memory
// and how long it took.
func gitIndexPack(t testing.TB, path string) ([]byte, int64, time.Duration) {
	t.Helper()
	dir := t.TempDir()
	git(t, dir, "init", "-q", "--bare", "ref.git")
	idx := filepath.Join(dir, "ref.idx")
	cmd := exec.Command("git", "index-pack", "--strict", "-o", idx, path)
	cmd.Dir = filepath.Join(dir, "ref.git")
	start := time.Now()
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("git index-pack: %v\n%s", err, out)
	}
	took := time.Since(start)
	data, err := os.ReadFile(idx)
	if err != nil {
		t.Fatal(err)
	}
	return data, cmd.ProcessState.SysUsage().(*syscall.Rusage).Maxrss << 10, took
}

// TestManySmallObjectsCostLittleMemory: pushes of 20,000 and 100,000 small files
// (the packs git pack-objects sends) are stored, and what each object beyond the
// first 20,000 adds to the process's peak resident memory is less than 160
// bytes (the indexer's tables hold about 75; before them, maps and structs on
// the heap, 924 an object were measured). The slope leaves out what a store
// costs whatever its size (buffers, the heap's own minimum). The index is the one
// git index-pack writes for the same pack, byte for byte; git fsck finds the
// repository whole, and CheckCommand finds the tip a commit without go-git
// loading the new pack's index (50 bytes an object).
func TestManySmallObjectsCostLittleMemory(t *testing.T) {
	var objects [2]int
	var peaks [2]int64
	var repo *Repo
	var path string
	var tip plumbing.Hash
	var p *Pack
	for k, n := range []int{20_000, 100_000} {
		src := manySmallObjects(t, n)
		tip = plumbing.NewHash(git(t, src, "rev-parse", "main"))
		path = packFile(t, src)
		repo = emptyRepo(t)
		var took time.Duration
		p, peaks[k], took = storePeak(t, repo, path, Limits{Tips: []plumbing.Hash{tip}})
		objects[k] = p.Objects
		t.Logf("%d objects in %d bytes of pack stored in %v: peak RSS +%d KiB", p.Objects, p.Bytes, took.Round(time.Millisecond), peaks[k]>>10)
		if p.Objects < n {
			t.Fatalf("the pack holds %d objects, want at least %d", p.Objects, n)
		}
	}
	perObject := (peaks[1] - peaks[0]) / int64(objects[1]-objects[0])
	t.Logf("%d bytes an object", perObject)
	if perObject >= 160 {
		t.Fatalf("each object raised the peak RSS by %d bytes, want less than 160", perObject)
	}

	ours, err := os.ReadFile(filepath.Join(repo.Dir, "objects", "pack", p.Name+".idx"))
	if err != nil {
		t.Fatal(err)
	}
	theirs, _, _ := gitIndexPack(t, path)
	if !bytes.Equal(ours, theirs) {
		t.Fatalf("the index differs from git index-pack's (%d and %d bytes)", len(ours), len(theirs))
	}
	debug.FreeOSMemory()
	if err := os.WriteFile("/proc/self/clear_refs", []byte("5"), 0); err != nil {
		t.Fatal(err)
	}
	before := procStatus(t, "VmRSS")
	// The Repo that stored the pack knows its tip; the rest is go-git's.
	if err := repo.CheckCommand(Command{Name: "refs/heads/main", New: tip}); err != nil {
		t.Fatal(err)
	}
	if rise := procStatus(t, "VmHWM") - before; rise > 1<<20 {
		t.Fatalf("CheckCommand raised the peak RSS by %d KiB", rise>>10)
	}
	if err := repo.UpdateRef(Command{Name: "refs/heads/main", New: tip}); err != nil {
		t.Fatal(err)
	}
	git(t, repo.Dir, "fsck", "--strict", "--no-dangling")
}

// BenchmarkStorePackManyObjects stores a push of many small files (100,000, and
// 1,000,000: the push that took a gitserver from 78 to 413 MB) and, in the same
// iteration, has git index-pack index the same pack, as git's receive-pack
// does, and reports both: bex's peak resident memory over what it was before the
// store, per object and in all, beside index-pack's peak (its whole process), and
// the times.
func BenchmarkStorePackManyObjects(b *testing.B) {
	for _, n := range []int{100_000, 1_000_000} {
		b.Run(fmt.Sprintf("%dk", n/1000), func(b *testing.B) {
			path := packFile(b, manySmallObjects(b, n))
			var bexPeak, gitPeak int64
			var bexTime, gitTime time.Duration
			objects := 0
			for b.Loop() {
				p, peak, took := storePeak(b, emptyRepo(b), path, Limits{})
				objects = p.Objects
				bexPeak, bexTime = max(bexPeak, peak), bexTime+took
				_, peak, took = gitIndexPack(b, path)
				gitPeak, gitTime = max(gitPeak, peak), gitTime+took
			}
			b.ReportMetric(float64(bexPeak)/float64(objects), "bex-B/object")
			b.ReportMetric(float64(gitPeak)/float64(objects), "git-B/object")
			b.ReportMetric(float64(bexPeak)/(1<<20), "bex-peak-MiB")
			b.ReportMetric(float64(gitPeak)/(1<<20), "git-peak-MiB")
			b.ReportMetric(bexTime.Seconds()/float64(b.N), "bex-s/op")
			b.ReportMetric(gitTime.Seconds()/float64(b.N), "git-s/op")
		})
	}
}
