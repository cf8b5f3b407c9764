package receive

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"sync"

	"github.com/go-git/go-billy/v5/osfs"
	"github.com/go-git/go-git/v5/plumbing"
	"github.com/go-git/go-git/v5/plumbing/cache"
	"github.com/go-git/go-git/v5/plumbing/protocol/packp"
	"github.com/go-git/go-git/v5/plumbing/protocol/packp/capability"
	"github.com/go-git/go-git/v5/storage/filesystem"
)

// Repo is a bare repository on disk that receives pushes. Callers serialise pushes
// to one Repo (the gitserver holds the app's push lock); reads may run beside them.
type Repo struct {
	// Dir is the repository's directory (the one that holds HEAD, objects/, refs/).
	Dir string

	mu sync.Mutex
	// stored are the types of the tips (Limits.Tips) that StorePack found in the
	// packs it stored, for CheckCommand: go-git would load the whole index of the
	// pack to find one object, 50 bytes an object of the push.
	stored map[plumbing.Hash]plumbing.ObjectType
}

// ErrNotExist is returned by Open for a directory that holds no repository.
var ErrNotExist = errors.New("repository does not exist")

// Open opens the bare repository in dir.
func Open(dir string) (*Repo, error) {
	if _, err := os.Stat(filepath.Join(dir, "HEAD")); err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, ErrNotExist
		}
		return nil, err
	}
	return &Repo{Dir: dir}, nil
}

// Init creates an empty bare repository in dir whose HEAD names branch. It builds
// the repository beside dir and renames it into place, so that a crash leaves either
// nothing or a whole repository. An existing repository is an error.
func Init(dir, branch string) (*Repo, error) {
	if _, err := os.Stat(dir); err == nil {
		return nil, fmt.Errorf("%s already exists", dir)
	}
	// Repositories are root's alone (the gitserver serves them as root): 0700
	// and 0600, and git itself is told so (core.sharedRepository), for what
	// the git binary writes into them (an upstream's fetch).
	parent := filepath.Dir(dir)
	if err := os.MkdirAll(parent, 0o700); err != nil {
		return nil, err
	}
	if err := os.Chmod(parent, 0o700); err != nil {
		return nil, err
	}
	tmp, err := os.MkdirTemp(parent, ".init-"+filepath.Base(dir)+"-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(tmp)
	for _, d := range []string{"objects/pack", "objects/info", "refs/heads", "refs/tags"} {
		if err := os.MkdirAll(filepath.Join(tmp, d), 0o700); err != nil {
			return nil, err
		}
	}
	files := map[string]string{
		"HEAD":        "ref: refs/heads/" + branch + "\n",
		"config":      "[core]\n\trepositoryformatversion = 0\n\tfilemode = true\n\tbare = true\n\tsharedRepository = 0600\n",
		"description": "bex app repository\n",
	}
	for name, content := range files {
		if err := os.WriteFile(filepath.Join(tmp, name), []byte(content), 0o600); err != nil {
			return nil, err
		}
	}
	if err := os.Rename(tmp, dir); err != nil {
		return nil, err
	}
	return &Repo{Dir: dir}, nil
}

// storage opens go-git's view of the repository. It is opened per operation: go-git
// caches the list of packs, and a push adds one.
func (r *Repo) storage() *filesystem.Storage {
	return filesystem.NewStorageWithOptions(osfs.New(r.Dir), cache.NewObjectLRUDefault(), filesystem.Options{})
}

// Refs returns the repository's branches and tags with their values.
func (r *Repo) Refs() (map[plumbing.ReferenceName]plumbing.Hash, error) {
	iter, err := r.storage().IterReferences()
	if err != nil {
		return nil, err
	}
	refs := map[plumbing.ReferenceName]plumbing.Hash{}
	err = iter.ForEach(func(ref *plumbing.Reference) error {
		if ref.Type() == plumbing.HashReference && (ref.Name().IsBranch() || ref.Name().IsTag()) {
			refs[ref.Name()] = ref.Hash()
		}
		return nil
	})
	return refs, err
}

// Ref returns the value of one ref, or the zero hash when it does not exist.
func (r *Repo) Ref(name plumbing.ReferenceName) (plumbing.Hash, error) {
	ref, err := r.storage().Reference(name)
	if errors.Is(err, plumbing.ErrReferenceNotFound) {
		return plumbing.ZeroHash, nil
	}
	if err != nil {
		return plumbing.ZeroHash, err
	}
	return ref.Hash(), nil
}

// HasObject reports whether the repository holds object h.
func (r *Repo) HasObject(h plumbing.Hash) bool {
	return r.storage().HasEncodedObject(h) == nil
}

// Capabilities are what bex's receive-pack offers. Thin packs are accepted (there is
// no no-thin), and report-status-v2 is not offered: report-status says all we need.
func Capabilities(agent string) *capability.List {
	caps := capability.NewList()
	for _, c := range []capability.Capability{
		capability.ReportStatus, capability.Sideband64k, capability.DeleteRefs,
		capability.OFSDelta, capability.Atomic, capability.PushOptions, capability.Quiet,
	} {
		_ = caps.Set(c)
	}
	_ = caps.Set(capability.Agent, agent)
	return caps
}

// AdvertiseRefs writes the receive-pack ref advertisement: every branch and tag,
// sorted, with caps on the first line (or on "capabilities^{}" when there is none).
func (r *Repo) AdvertiseRefs(w io.Writer, caps *capability.List) error {
	refs, err := r.Refs()
	if err != nil {
		return err
	}
	ar := packp.NewAdvRefs()
	ar.Capabilities = caps
	names := make([]string, 0, len(refs))
	for name := range refs {
		names = append(names, string(name))
	}
	sort.Strings(names)
	for _, name := range names {
		if err := ar.AddReference(plumbing.NewHashReference(plumbing.ReferenceName(name), refs[plumbing.ReferenceName(name)])); err != nil {
			return err
		}
	}
	return ar.Encode(w)
}

// AdvertiseEmpty writes the advertisement of a repository that does not exist yet:
// no refs, only the capabilities. The first push creates the repository.
func AdvertiseEmpty(w io.Writer, caps *capability.List) error {
	ar := packp.NewAdvRefs()
	ar.Capabilities = caps
	return ar.Encode(w)
}
