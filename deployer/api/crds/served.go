package crds

import (
	"context"
	"fmt"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/rest"
)

// WaitServed waits until the API server's discovery lists every kind of bex's
// CRDs in every served version. Established says the API server serves a CRD's
// objects; discovery is updated after that, on its own, and a call whose REST
// mapper looked the kind up in between (App listed, User not yet) fails with
// `no matches for kind "User"`. So: Install, WaitServed, and only then use bex's
// kinds, with a client made after it.
func WaitServed(ctx context.Context, cfg *rest.Config) error {
	all, err := All()
	if err != nil {
		return err
	}
	// A plain discovery client: no cache, every call asks the API server.
	dc, err := discovery.NewDiscoveryClientForConfig(rest.CopyConfig(cfg))
	if err != nil {
		return err
	}
	for {
		missing := unserved(dc, all)
		if missing == "" {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("the API server's discovery does not list %s yet: %w", missing, ctx.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// unserved names the first kind discovery does not list, or "".
func unserved(dc discovery.DiscoveryInterface, all []*apiextensionsv1.CustomResourceDefinition) string {
	lists := map[string][]string{}
	for _, crd := range all {
		for _, v := range crd.Spec.Versions {
			if !v.Served {
				continue
			}
			gv := crd.Spec.Group + "/" + v.Name
			names, ok := lists[gv]
			if !ok {
				list, err := dc.ServerResourcesForGroupVersion(gv)
				if err != nil {
					// Not listed yet (404) or a transient error: look again.
					return gv + " (" + err.Error() + ")"
				}
				for _, r := range list.APIResources {
					names = append(names, r.Kind+"/"+r.Name)
				}
				lists[gv] = names
			}
			want := crd.Spec.Names.Kind + "/" + crd.Spec.Names.Plural
			found := false
			for _, n := range names {
				found = found || n == want
			}
			if !found {
				return fmt.Sprintf("kind %s in %s", crd.Spec.Names.Kind, gv)
			}
		}
	}
	return ""
}
