package local

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	appv1 "bex.co/bex/deployer/api/v1alpha1"
	"bex.co/bex/internal/machine/tenantnet"
)

// An instance whose config takes a value from a database's credentials Secret
// (appv1.LinkedDatabases) is linked to that database: the tenants' network lets
// it, and nothing else, reach the database's port on the apps' gateway
// (tenantnet's LINKS chain, keyed by the instance's network namespace). The
// rules are made with the namespace, before the container, by whichever
// process makes the instance (the deployer for an app's instances, the
// gitserver or the deployer for one-offs), and go with the namespace's
// teardown, so a link lives exactly as long as an instance that has it: an
// unlink is a new release whose instances have none.

// linkPorts are the database ports env links to: the port key of each
// database credentials Secret its values come from. A Secret that is missing,
// or has no port, is an error that names it, as for any config var.
func (r *Runtime) linkPorts(ctx context.Context, namespace string, env []appv1.EnvVar) ([]uint16, error) {
	var ports []uint16
	for _, db := range appv1.LinkedDatabases(env) {
		name := appv1.CredentialsSecret(db)
		s := &corev1.Secret{}
		if err := r.kube.Get(ctx, types.NamespacedName{Namespace: namespace, Name: name}, s); err != nil {
			return nil, fmt.Errorf("database %s: secret %s/%s: %w", db, namespace, name, err)
		}
		if s.Labels[appv1.LabelDatabase] != db {
			// Not made by the database's controller: a Secret that merely has
			// the name gives no reach.
			continue
		}
		p, err := strconv.ParseUint(string(s.Data[appv1.CredentialPort]), 10, 16)
		if err != nil || p == 0 {
			return nil, fmt.Errorf("database %s: secret %s/%s has no port yet", db, namespace, name)
		}
		ports = append(ports, uint16(p))
	}
	slices.Sort(ports)
	return slices.Compact(ports), nil
}

// sweepLinks removes the link rules of namespaces that are gone (a crash
// between a namespace's rules and its teardown). Whether one is gone is asked
// of the machine (tenantnet.Attached), not of this runtime's directories: the
// links' chain holds the rules of every bex on the machine, and of the
// one-offs of every process, which a sweep by this runtime's namespaces would
// cut off from their databases.
func (r *Runtime) sweepLinks(ctx context.Context) {
	if r.net.mode == NetworkHost {
		return
	}
	if err := r.net.tn.SweepLinks(ctx, tenantnet.Attached); err != nil {
		r.log.Warn("remove the database links of namespaces that are gone", "err", err)
	}
}

// portsLabel and portsOfLabel write and read labelLinks.
func portsLabel(ports []uint16) string {
	s := make([]string, len(ports))
	for i, p := range ports {
		s[i] = strconv.Itoa(int(p))
	}
	return strings.Join(s, ",")
}

func portsOfLabel(l string) []uint16 {
	var out []uint16
	for f := range strings.SplitSeq(l, ",") {
		if p, err := strconv.ParseUint(f, 10, 16); err == nil && p > 0 {
			out = append(out, uint16(p))
		}
	}
	return out
}
