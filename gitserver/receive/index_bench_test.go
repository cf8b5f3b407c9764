package receive

import (
	"bufio"
	"context"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"bex.co/bex/internal/testenv"
)

// bigHistoryPack writes, with git fast-import, the history that gitserver's
// BenchmarkReceive pushes (commits commits holding about totalBytes of
// incompressible content, one new file per commit and one file that every commit
// edits, so that the pack holds deltas of blobs and trees) and returns the path of
// the pack a push of it sends.
func bigHistoryPack(t testing.TB, commits, totalBytes int) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "big")
	testenv.FastImport(t, dir, func(w *bufio.Writer) {
		rng := rand.New(rand.NewPCG(1, 2))
		blob := make([]byte, totalBytes/commits)
		log := strings.Repeat("a line that every version of the log shares\n", 200)
		for i := 1; i <= commits; i++ {
			for j := range blob {
				blob[j] = byte(rng.Uint32())
			}
			log += fmt.Sprintf("commit %d\n", i)
			fmt.Fprintf(w, "commit refs/heads/main\ncommitter bex <test@bex.co> %d +0000\ndata <<EOT\ncommit %d\nEOT\n", 1700000000+i, i)
			fmt.Fprintf(w, "M 644 inline data/%04d.bin\ndata %d\n", i, len(blob))
			w.Write(blob)
			fmt.Fprintf(w, "\nM 644 inline log.txt\ndata %d\n%s\n", len(log), log)
		}
	})
	return packFile(t, dir)
}

// storeTimed stores the pack at path into a new repository and returns the
// object count and how long StorePack took.
func storeTimed(t testing.TB, path string) (int, time.Duration) {
	t.Helper()
	repo := emptyRepo(t)
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	start := time.Now()
	p, err := repo.StorePack(context.Background(), bufio.NewReaderSize(f, 64<<10), Limits{})
	if err != nil {
		t.Fatal(err)
	}
	return p.Objects, time.Since(start)
}

// gitIndexStrict indexes the pack at path as git's receive-pack does with
// receive.fsckObjects: `git index-pack --stdin --strict` in a new bare
// repository, the pack on its standard input, and returns how long it took.
func gitIndexStrict(t testing.TB, path string) time.Duration {
	t.Helper()
	bare := filepath.Join(t.TempDir(), "ref.git")
	git(t, filepath.Dir(bare), "init", "-q", "--bare", bare)
	in, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	cmd := exec.Command("git", "index-pack", "--stdin", "--strict", "--fix-thin")
	cmd.Dir = bare
	cmd.Stdin = in
	start := time.Now()
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("git index-pack: %v\n%s", err, out)
	}
	return time.Since(start)
}

// BenchmarkIndexBigHistory indexes the pack of gitserver's BenchmarkReceive/full
// (2,000 commits, 50 MB) with StorePack and, in the same iteration, with git
// index-pack --strict (fsck on both sides), and reports both, their ratio, and
// each one's cost per object and per MiB of pack. Profile bex's side alone with
// BEX_BENCH_ONLY=bex and -cpuprofile.
func BenchmarkIndexBigHistory(b *testing.B) {
	path := bigHistoryPack(b, 2000, 50<<20)
	st, err := os.Stat(path)
	if err != nil {
		b.Fatal(err)
	}
	hdr := make([]byte, 12)
	if f, err := os.Open(path); err != nil {
		b.Fatal(err)
	} else if _, err := f.ReadAt(hdr, 0); err != nil {
		b.Fatal(err)
	} else {
		f.Close()
	}
	objects := int(binary.BigEndian.Uint32(hdr[8:]))
	only := os.Getenv("BEX_BENCH_ONLY")
	var bex, gitTime time.Duration
	for b.Loop() {
		if only != "git" {
			n, took := storeTimed(b, path)
			if n != objects {
				b.Fatalf("stored %d objects, the pack holds %d", n, objects)
			}
			bex += took
		}
		if only != "bex" {
			gitTime += gitIndexStrict(b, path)
		}
	}
	n, mib := float64(b.N), float64(st.Size())/(1<<20)
	b.ReportMetric(float64(objects), "objects")
	b.ReportMetric(mib, "pack-MiB")
	if only != "git" {
		b.ReportMetric(bex.Seconds()/n, "bex-s/op")
		b.ReportMetric(float64(bex.Nanoseconds())/n/float64(objects), "bex-ns/object")
		b.ReportMetric(bex.Seconds()*1000/n/mib, "bex-ms/MiB")
	}
	if only != "bex" {
		b.ReportMetric(gitTime.Seconds()/n, "git-s/op")
		b.ReportMetric(float64(gitTime.Nanoseconds())/n/float64(objects), "git-ns/object")
		b.ReportMetric(gitTime.Seconds()*1000/n/mib, "git-ms/MiB")
	}
	if only == "" {
		b.ReportMetric(float64(bex)/float64(gitTime), "bex/git")
	}
}
