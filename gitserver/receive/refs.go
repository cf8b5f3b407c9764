package receive

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/go-git/go-git/v5/plumbing"
)

// ErrStale means a ref no longer has the value the pusher saw: someone pushed in
// between. git shows it as a rejection; fetching and pushing again resolves it.
var ErrStale = errors.New("the ref changed during the push: fetch and push again")

// UpdateRef moves (or creates, or deletes) one ref if it still has cmd.Old, the way
// git does: the new value goes to <ref>.lock, is synced, and is renamed over the ref,
// so a crash leaves the old value or the new one, never a torn file. Callers
// serialise updates per repository, so a .lock left by a crash is stale and removed.
func (r *Repo) UpdateRef(cmd Command) error {
	if err := checkRefName(cmd.Name); err != nil {
		return err
	}
	path := filepath.Join(r.Dir, filepath.FromSlash(string(cmd.Name)))
	lock := path + ".lock"
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return err
	}
	f, err := os.OpenFile(lock, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if errors.Is(err, os.ErrExist) {
		os.Remove(lock)
		f, err = os.OpenFile(lock, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	}
	if err != nil {
		return fmt.Errorf("locking %s: %w", cmd.Name, err)
	}
	committed := false
	defer func() {
		if !committed {
			f.Close()
			os.Remove(lock)
		}
	}()

	cur, err := r.Ref(cmd.Name)
	if err != nil {
		return err
	}
	if cur != cmd.Old {
		return ErrStale
	}
	if cmd.IsDelete() {
		// go-git removes the loose file and rewrites packed-refs when the ref is
		// packed there.
		if err := r.storage().RemoveReference(cmd.Name); err != nil {
			return fmt.Errorf("deleting %s: %w", cmd.Name, err)
		}
		return nil
	}
	if _, err := f.WriteString(cmd.New.String() + "\n"); err != nil {
		return err
	}
	if err := f.Sync(); err != nil {
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := os.Rename(lock, path); err != nil {
		return err
	}
	committed = true
	syncDir(filepath.Dir(path))
	return nil
}

// SetHead points HEAD at branch, so that clones check it out.
func (r *Repo) SetHead(branch string) error {
	name := plumbing.NewBranchReferenceName(branch)
	if err := checkRefName(name); err != nil {
		return err
	}
	path := filepath.Join(r.Dir, "HEAD")
	tmp := path + ".lock"
	if err := os.WriteFile(tmp, []byte("ref: "+string(name)+"\n"), 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, path)
}

// Head returns the branch HEAD names.
func (r *Repo) Head() (string, error) {
	ref, err := r.storage().Reference(plumbing.HEAD)
	if err != nil {
		return "", err
	}
	if ref.Type() != plumbing.SymbolicReference {
		return "", errors.New("HEAD is detached")
	}
	return ref.Target().Short(), nil
}

// SetUpstreamRef points a ref outside refs/heads and refs/tags (refs/bex/...) at h,
// unconditionally: it records what was fetched, and keeps it from being collected.
func (r *Repo) SetUpstreamRef(name plumbing.ReferenceName, h plumbing.Hash) error {
	s := string(name)
	if !strings.HasPrefix(s, "refs/bex/") || strings.Contains(s, "..") || strings.HasSuffix(s, ".lock") {
		return fmt.Errorf("%q is not a bex ref", s)
	}
	return r.storage().SetReference(plumbing.NewHashReference(name, h))
}
