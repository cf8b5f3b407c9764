package builder

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// A large file of the last export is copied from the cache by the next one, a
// cached file that does not hold its blob is never exported (the blob is
// inflated and the cache mended), and an export leaves only what it used.
func TestExportCacheKeepsTheLastExportsLargeFilesAndNothingElse(t *testing.T) {
	g := newGitRepo(t)
	big := bytes.Repeat([]byte("a large file of the app, "), exportCacheMin/16)
	small := g.blob("a small file\n")
	bigID := g.run(big, "hash-object", "-w", "--stdin")
	withBig := g.commit(g.tree(entry{Mode: "100755", Name: "server", ID: bigID}, entry{Mode: "100644", Name: "index.html", ID: small}))
	cache := filepath.Join(g.dir, exportCacheDir)
	export := func(commit string) string {
		t.Helper()
		out := filepath.Join(t.TempDir(), "export")
		if _, err := exportCommitCached(context.Background(), g.dir, commit, out, cache, defaultLimits); err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile(filepath.Join(out, "server"))
		if err == nil && !bytes.Equal(got, big) {
			t.Fatalf("server: %d bytes, not the blob's %d", len(got), len(big))
		}
		if fi, err := os.Stat(filepath.Join(out, "server")); err == nil && fi.Mode().Perm() != 0o755 {
			t.Fatalf("server: mode %v, want 0755", fi.Mode())
		}
		return out
	}
	cached := func() []string {
		t.Helper()
		entries, err := os.ReadDir(cache)
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, e := range entries {
			names = append(names, e.Name())
		}
		return names
	}

	export(withBig)
	if got := cached(); !slices.Equal(got, []string{bigID}) {
		t.Fatalf("after the first export the cache holds %q, want the large file alone (%s)", got, bigID)
	}
	export(withBig) // from the cache: export checks the content

	// A file cut short (a crash), then one changed in place to other bytes of
	// the same size: neither is exported, and the cache holds the blob again.
	for _, bad := range [][]byte{big[:len(big)/2], bytes.Repeat([]byte("x"), len(big))} {
		if err := os.WriteFile(filepath.Join(cache, bigID), bad, 0o600); err != nil {
			t.Fatal(err)
		}
		export(withBig)
		if got, _ := os.ReadFile(filepath.Join(cache, bigID)); !bytes.Equal(got, big) {
			t.Fatalf("the cache's bad file (%d bytes) was kept", len(bad))
		}
	}

	// A commit without it: the cache keeps nothing of the one before.
	if err := os.WriteFile(filepath.Join(cache, ".tmp-left-by-a-crash"), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	export(g.commit(g.tree(entry{Mode: "100644", Name: "index.html", ID: small})))
	if got := cached(); len(got) != 0 {
		t.Fatalf("after a commit without large files the cache holds %q", got)
	}
}
