package main

import (
	"errors"

	"bex.co/bex/gitserver/backend"
	"bex.co/bex/internal/volumearchive"
)

// restoreError is an archive the runtime refused as an Invalid error (the
// sender's to fix), on either runtime.
func restoreError(err error, app, name string) error {
	if errors.Is(err, volumearchive.ErrBadArchive) {
		return backend.Errorf(backend.Invalid, "volumes:restore refused the archive, and the volume %s of %s is as it was: %v", name, app, err)
	}
	return err
}
