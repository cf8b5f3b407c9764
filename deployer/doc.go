// Package deployer is bex's operator: the App reconciler. The App object is the
// desired state, a runtime (runtime/local on one node, runtime/kube on a cluster)
// makes it true, and the App's status tells the truth about what serves.
//
// Reconcile follows Cluster API's shape: get the App; add the finalizer; take a
// snapshot for the patch; defer the status computation and one status patch; run
// small phase functions (the runtime sync, release pruning); derive conditions in
// pure functions and the phase from them in one place. Status.phase is for people;
// decisions are made from conditions.
//
// Pruning a release also removes its image when the runtime can remove images
// (runtime.Images: containerd's store, or the registry on a cluster) and Config.ImageRepo names the builder's repository: only
// <ImageRepo>/<app> names, only digests no kept release and no container uses,
// and the Release is deleted once its image went (a release whose instance
// still drains waits for a later reconcile). Deleting an App removes every
// image under <ImageRepo>/<app> (RemoveRepository) before its finalizer goes.
package deployer
