package kube

import (
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	appv1 "bex.co/bex/deployer/api/v1alpha1"
)

// TestADatabasesOneOffIsOwnedByTheDatabase: the synthetic App a database's
// one-off runs as does not exist, so its pod names the Database, else the
// garbage collector deletes it at once. An App that only claims the label is
// owned as an App.
func TestADatabasesOneOffIsOwnedByTheDatabase(t *testing.T) {
	db := &appv1.App{ObjectMeta: metav1.ObjectMeta{Name: appv1.RuntimeName("shop"), UID: "db-uid", Labels: map[string]string{appv1.LabelDatabase: "shop"}}}
	if ref := ownerReference(db); *ref.Kind != "Database" || *ref.Name != "shop" || *ref.UID != "db-uid" {
		t.Errorf("a database's one-off is owned by %s %s (%s)", *ref.Kind, *ref.Name, *ref.UID)
	}
	app := &appv1.App{ObjectMeta: metav1.ObjectMeta{Name: "web", UID: "app-uid", Labels: map[string]string{appv1.LabelDatabase: "shop"}}}
	if ref := ownerReference(app); *ref.Kind != "App" || *ref.Name != "web" {
		t.Errorf("an app labelled with a database is owned by %s %s", *ref.Kind, *ref.Name)
	}
}
