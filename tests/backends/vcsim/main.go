// vcsim for banlieue's tests: govmomi's vSphere simulator (Debian's
// golang-github-vmware-govmomi-dev 0.24.2 ships the `simulator` package but no
// vcsim command), serving the default vCenter model over plain HTTP.
//
//	vcsim -l 127.0.0.1:PORT [-username user] [-password pass] [-template NAME]
//
// The model is simulator.VPX(): datacenter DC0, cluster DC0_C0 (3 hosts) plus a
// standalone host DC0_H0, datastore LocalDS_0, network "VM Network" and the
// portgroup DC0_DVPG0, VMs DC0_H0_VM0/1 and DC0_C0_RP0_VM0/1 (powered on).
// On top of it:
//
//   - Only -username / -password log in (vcsim otherwise accepts any
//     non-empty pair), so a wrong password gets an InvalidLogin fault.
//   - A template named -template (default "tmpl-debian") is cloned from
//     DC0_C0_RP0_VM0 and marked as a template, to clone machines from.
//   - Guest addresses: vcsim 0.24.2 reports none unless VMs run as Docker
//     containers (guest.ipAddress is empty and guest.net[].ipAddress nil). A
//     watcher stands in for VMware Tools: every 50 ms, a powered-on VM without an
//     address gets a deterministic one, 10.<a>.<b>.<c> from the FNV-1a hash of
//     its config.instanceUuid (c in 2..254), as guest.ipAddress and
//     guest.net[0].ipAddress (a guest.net entry is added if the VM has none), and
//     guest.toolsRunningStatus = guestToolsRunning; a powered-off VM loses them
//     again (as when tools stop). So an address appears shortly after power-on.
//   - Sessions: each Login makes one session, listed in SessionManager's
//     sessionList (RetrieveProperties) until Logout; idle sessions never expire.
//     The template is made over a session that is logged out again, so the
//     list starts empty.
//
// One line "vcsim listening on http://HOST:PORT/sdk" goes to stdout once the
// server accepts connections; it stops on SIGTERM/SIGINT or when stdin closes.
package main

import (
	"context"
	"flag"
	"fmt"
	"hash/fnv"
	"io"
	"log"
	"net/url"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/vmware/govmomi"
	"github.com/vmware/govmomi/find"
	"github.com/vmware/govmomi/simulator"
	"github.com/vmware/govmomi/vim25/types"
)

func main() {
	listen := flag.String("l", "127.0.0.1:8989", "listen address")
	username := flag.String("username", "user", "the one user that may log in")
	password := flag.String("password", "pass", "its password")
	template := flag.String("template", "tmpl-debian", "name of the template to create")
	vms := flag.Int("vm", 0, "VMs per host and per cluster resource pool (0: the model's two)")
	flag.Parse()

	model := simulator.VPX()
	if *vms > 0 {
		model.Machine = *vms
	}
	if err := model.Create(); err != nil {
		log.Fatalf("creating the model: %v", err)
	}
	defer model.Remove()
	model.Service.Listen = &url.URL{Host: *listen, User: url.UserPassword(*username, *password)}
	server := model.Service.NewServer()
	defer server.Close()

	if err := makeTemplate(server.URL, *template); err != nil {
		log.Fatalf("creating template %s: %v", *template, err)
	}
	stop := make(chan struct{})
	go watchGuests(stop)

	u := *server.URL
	u.User = nil
	fmt.Printf("vcsim listening on %s\n", u.String())
	os.Stdout.Sync()

	done := make(chan struct{}, 2)
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	go func() { <-sig; done <- struct{}{} }()
	go func() { _, _ = io.Copy(io.Discard, os.Stdin); done <- struct{}{} }()
	<-done
	close(stop)
}

// makeTemplate clones DC0_C0_RP0_VM0 into a powered-off template, then logs out.
func makeTemplate(u *url.URL, name string) error {
	ctx := context.Background()
	c, err := govmomi.NewClient(ctx, u, true)
	if err != nil {
		return err
	}
	defer c.Logout(ctx)
	finder := find.NewFinder(c.Client, false)
	dc, err := finder.Datacenter(ctx, "DC0")
	if err != nil {
		return err
	}
	finder.SetDatacenter(dc)
	vm, err := finder.VirtualMachine(ctx, "DC0_C0_RP0_VM0")
	if err != nil {
		return err
	}
	folders, err := dc.Folders(ctx)
	if err != nil {
		return err
	}
	task, err := vm.Clone(ctx, folders.VmFolder, name, types.VirtualMachineCloneSpec{Template: true})
	if err != nil {
		return err
	}
	return task.Wait(ctx)
}

// guestAddress is the deterministic address of the VM with this instance UUID.
func guestAddress(instanceUUID string) string {
	h := fnv.New32a()
	_, _ = h.Write([]byte(instanceUUID))
	n := h.Sum32()
	return fmt.Sprintf("10.%d.%d.%d", (n>>16)&0xff, (n>>8)&0xff, 2+(n&0xff)%253)
}

// watchGuests plays VMware Tools: powered-on VMs get an address, powered-off ones lose it.
func watchGuests(stop chan struct{}) {
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-stop:
			return
		case <-tick.C:
		}
		for _, e := range simulator.Map.All("VirtualMachine") {
			vm, ok := e.(*simulator.VirtualMachine)
			if !ok {
				continue
			}
			simulator.Map.WithLock(vm, func() { updateGuest(vm) })
		}
	}
}

func updateGuest(vm *simulator.VirtualMachine) {
	if vm.Config == nil || vm.Guest == nil || vm.Config.Template {
		return
	}
	on := vm.Runtime.PowerState == types.VirtualMachinePowerStatePoweredOn
	switch {
	case on && vm.Guest.IpAddress == "":
		ip := guestAddress(vm.Config.InstanceUuid)
		nets := append([]types.GuestNicInfo(nil), vm.Guest.Net...)
		if len(nets) == 0 {
			nets = append(nets, types.GuestNicInfo{Network: "VM Network", Connected: true, DeviceConfigId: -1})
		}
		nets[0].IpAddress = []string{ip}
		simulator.Map.Update(vm, []types.PropertyChange{
			{Name: "guest.ipAddress", Val: ip},
			{Name: "guest.net", Val: nets},
			{Name: "guest.toolsRunningStatus", Val: string(types.VirtualMachineToolsRunningStatusGuestToolsRunning)},
			{Name: "summary.guest.ipAddress", Val: ip},
		})
	case !on && vm.Guest.IpAddress != "":
		nets := append([]types.GuestNicInfo(nil), vm.Guest.Net...)
		for i := range nets {
			nets[i].IpAddress = nil
		}
		simulator.Map.Update(vm, []types.PropertyChange{
			{Name: "guest.ipAddress", Val: ""},
			{Name: "guest.net", Val: nets},
			{Name: "guest.toolsRunningStatus", Val: string(types.VirtualMachineToolsRunningStatusGuestToolsNotRunning)},
			{Name: "summary.guest.ipAddress", Val: ""},
		})
	}
}
