// Package volumearchive writes a volume's files as a tar archive and replaces
// them with an archive's: volumes:backup and volumes:restore, on one machine
// (deployer/runtime/local's Volumes, on the host, base the app's first host id
// as the runtime recorded it, never read from the volume, whose root the app
// may chown)
// and on a cluster (`bex volume-archive` in a pod that mounts the volume's
// claim, base 0: the pod's own uid 0 is the app's).
//
// Every path goes through an os.Root of the volume, so nothing is followed out
// of it. Entries are relative names; ids are the container's (0 is the app's
// root); unmapped host ids are written as 65534, and an archive's ids beyond
// 65535 become the app's root; fifos and sockets are left out of a backup.
//
// The archive is the tenant's to write: Restore refuses, before anything stays
// written, a malformed, truncated or empty archive, an absolute name or a '..'
// segment, a path through a symbolic link (each parent must be a directory), a
// hard link to anything but a file earlier in the archive, device nodes and
// fifos. It extracts into a staging directory inside the volume and swaps it in
// at the end, so a refused or failed restore leaves the volume as it was, and
// the volume's own size (blocks and inodes) bounds what an archive can write:
// a full volume is a refusal ("the volume is full").
//
// Consistency is the caller's: the local runtime pauses the app's containers
// around Write and Restore; on a cluster the app runs meanwhile.
package volumearchive
