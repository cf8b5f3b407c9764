package pipeline

import (
	"fmt"
	"syscall"

	"bex.co/bex/gitserver/backend"
	"bex.co/bex/internal/bytesize"
)

// FreeSpace says how many bytes of the file system holding path are free to
// bex (what an unprivileged writer may still use) and how large it is.
type FreeSpace func(path string) (free, total uint64, err error)

// Statfs is the FreeSpace of the kernel: statfs(2)'s available and total blocks.
func Statfs(path string) (free, total uint64, err error) {
	var st syscall.Statfs_t
	if err := syscall.Statfs(path, &st); err != nil {
		return 0, 0, err
	}
	return st.Bavail * uint64(st.Bsize), st.Blocks * uint64(st.Bsize), nil
}

// DefaultMinFreeBytes and DefaultMinFreePercent are the free space kept on the
// state dir's file system: the smaller of the two (see Config.MinFreeBytes).
const (
	DefaultMinFreeBytes   = 1 << 30
	DefaultMinFreePercent = 5
)

// minFree is the margin on a file system of total bytes: the smaller of
// MinFreeBytes and MinFreePercent of total, either one being 0 turning it off.
func (c Config) minFree(total uint64) uint64 {
	if c.MinFreeBytes <= 0 || c.MinFreePercent <= 0 {
		return 0
	}
	m := uint64(c.MinFreeBytes)
	if p := uint64(float64(total) * c.MinFreePercent / 100); p < m {
		m = p
	}
	return m
}

// CheckDisk refuses work that writes to the state dir (a push's pack, a build's
// fetch and image) when its file system has less than the margin free: the
// refusal says how much is free and where to look, and nothing has been written;
// again is what to do after ("push again"). Its kind is Invalid (it cannot be
// done as things are), which the backend passes on as it is: Failed would add
// that a build ran, Conflict that another operation holds the app.
// A file system that cannot be asked does not stop anything: the write itself
// then fails cleanly if the disk is full (receive writes packs aside and moves no
// ref before they are whole).
func (p *Pipeline) CheckDisk(again string) error {
	dir := p.cfg.StateDir
	if dir == "" {
		dir = p.cfg.ReposDir
	}
	free, total, err := p.cfg.FreeSpace(dir)
	if err != nil {
		p.log.Warn("cannot read the free disk space", "dir", dir, "err", err)
		return nil
	}
	margin := p.cfg.minFree(total)
	if free >= margin {
		return nil
	}
	return backend.Errorf(backend.Invalid,
		"the disk of %s has %s free (under the %s bex keeps): free space on it and %s (%s)",
		dir, bytesize.FormatUint(free), bytesize.FormatUint(margin), again, WhereToLook)
}

// WhereToLook ends both lines: the commands that show and free the disk.
const WhereToLook = "an admin's system:df shows what uses it, system:prune removes what is reclaimable"

// DiskFilled is the line for work that ran out of space part way: what it wrote
// is gone, nothing moved.
func (p *Pipeline) DiskFilled(again string) string {
	dir := p.cfg.StateDir
	if dir == "" {
		dir = p.cfg.ReposDir
	}
	return fmt.Sprintf("the disk of %s filled up, so nothing was stored: free space on it and %s (%s)", dir, again, WhereToLook)
}
