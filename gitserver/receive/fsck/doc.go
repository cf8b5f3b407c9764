// Package fsck checks git objects as `git fsck` and `receive.fsckObjects` do, on
// their raw bytes: the rules of git's fsck.c (tree entries: duplicates, order, empty
// names, '/', ".", "..", ".git" and the names that NTFS and HFS+ treat as ".git",
// modes; commit and tag headers; identities and their dates).
//
// It parses the bytes itself rather than through go-git's decoders, which normalize
// modes and accept malformed headers: what matters is what git and the export will
// make of the bytes. A problem is reported as an *Error whose text is git's own
// ("object 3f2a1c7: duplicateEntries: contains duplicate file entries").
//
// Severity follows `git index-pack --strict`, which receive.fsckObjects runs: git's
// errors and warnings refuse; its info-level findings are ignored, except bad file
// modes, which are refused because the export would have to guess what they mean.
package fsck
