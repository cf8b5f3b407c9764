package diskuse

// CacheRecord is one record of BuildKit's cache, as its DiskUsage reports it.
type CacheRecord struct {
	ID          string
	Description string
	// Size is the record's snapshot and blob, in bytes.
	Size int64
	// InUse: a build holds it now.
	InUse bool
	// Shared: an image in containerd holds the record's layers (its blobs
	// are the image's; removing the record frees only its own snapshot).
	Shared bool
	// Reclaimable: what BuildKit's prune removes now (not in use, not
	// shared, not BuildKit's internal or frontend records).
	Reclaimable bool
	// App is the app the record names, or "" (most records are layers and
	// sources that name none: the platform's).
	App string
}

// ImageBytes are bytes of content and snapshots, and what of them removing
// the reclaimable images frees.
type ImageBytes struct {
	Bytes, Reclaimable int64
}

// ImageUsage is what the images of the namespace hold, each blob and
// snapshot counted once: an app's when only its images hold it; Shared when
// two apps' images do, or an image bex did not make (a base image).
type ImageUsage struct {
	Apps   map[string]ImageBytes
	Shared ImageBytes
	// Reclaimable are, per app, the images (by digest) no Release keeps and no
	// container uses, with the bytes removing each alone frees.
	Reclaimable map[string][]ReclaimableImage
	// Blobs are every image blob by digest: its size, the app it is counted
	// for ("": the platform's) and whether removing the reclaimable images
	// frees it.
	Blobs map[string]Blob
	// LeaseBlobs are the blobs each lease holds, by the lease's id (BuildKit
	// names a cache record's lease by the record's id).
	LeaseBlobs map[string][]string
}

// Blob is one blob of the images.
type Blob struct {
	Size        int64
	App         string
	Reclaimable bool
}

// ReclaimableImage is one image system:prune removes: its names share Digest.
type ReclaimableImage struct {
	Names  []string
	Digest string
	// Bytes are the blobs and unpacked snapshots no other image holds: what
	// removing it frees once BuildKit's records of its layers are pruned too
	// (system:prune prunes them after the images); Freed what removing the
	// image alone frees: those no lease holds (BuildKit keeps its records'
	// blobs under leases).
	Bytes, Freed int64
}
