package daemons

import (
	"fmt"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// DefaultBuildCacheKeep is how long build cache nobody used is kept by default: a
// week, so that a warm rebuild of the week's commits is still cached.
const DefaultBuildCacheKeep = 168 * time.Hour

// DefaultBuildCacheBytes is the build cache's default bound for a state dir at dir:
// the smaller of 10 GiB and a tenth of dir's file system, so that the cache never
// takes the disk the apps and their images need.
func DefaultBuildCacheBytes(dir string) (int64, error) {
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return 0, fmt.Errorf("the size of the file system of %s: %w", dir, err)
	}
	return defaultBuildCacheBytes(int64(st.Blocks) * int64(st.Bsize)), nil
}

func defaultBuildCacheBytes(fsBytes int64) int64 {
	return min(int64(10<<30), fsBytes/10)
}

// gcPolicy is the GC policy of the enabled worker (section is
// "worker.containerd" or "worker.oci") for a cache of at most maxBytes whose
// records unused for longer than keep go whatever the size. buildkitd applies the
// rules in order after builds:
//   - every record unused for longer than keep (keep 0: none is too old);
//   - the records no image in containerd shares, least recently used first, down
//     to maxBytes.
//
// Both leave alone what buildkitd calls shared: the layers of images in containerd,
// whose bytes go with the images. buildkitd's default policy ends with an `all`
// rule that also removes those down to the bound; bex has none, because with the
// containerd worker that rule removed the records of the images' own layers even
// with the cache under its bound (builder/cache_test.go saw it), and a rebuild of
// the latest commit then ran every step again. maxBytes 0 writes nothing:
// buildkitd's default policy.
func gcPolicy(section string, maxBytes int64, keep time.Duration) string {
	if maxBytes <= 0 {
		return ""
	}
	var b strings.Builder
	if keep > 0 {
		fmt.Fprintf(&b, "\n[[%s.gcpolicy]]\n  keepDuration = %q\n", section, keep.String())
	}
	// Sizes are strings: buildkitd reads them as text (bytes, or a percentage).
	fmt.Fprintf(&b, "\n[[%s.gcpolicy]]\n  maxUsedSpace = \"%d\"\n", section, maxBytes)
	return b.String()
}
