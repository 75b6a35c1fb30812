/* Prints every IPv4 entry of getifaddrs(3) as "IF <name> <address> <netmask> <flags>", then
 * for each verbs device its RoCE v2 IPv4-mapped GID (index 3, when the port is Ethernet) as
 * "GID <ibdev> <a.b.c.d>"; then runs getifaddrs/freeifaddrs 1000 more times. */
#include <arpa/inet.h>
#include <ifaddrs.h>
#include <infiniband/verbs.h>
#include <net/if.h>
#include <stdio.h>
#include <string.h>

int main(void)
{
	struct ifaddrs *list, *p;
	char a[INET_ADDRSTRLEN], m[INET_ADDRSTRLEN];
	if (getifaddrs(&list)) {
		perror("getifaddrs");
		return 1;
	}
	for (p = list; p; p = p->ifa_next) {
		if (!p->ifa_addr || p->ifa_addr->sa_family != AF_INET)
			continue;
		inet_ntop(AF_INET, &((struct sockaddr_in *)p->ifa_addr)->sin_addr, a, sizeof a);
		inet_ntop(AF_INET, &((struct sockaddr_in *)p->ifa_netmask)->sin_addr, m, sizeof m);
		printf("IF %s %s %s %#x\n", p->ifa_name, a, m, p->ifa_flags);
	}
	freeifaddrs(list);

	int n = 0;
	struct ibv_device **devs = ibv_get_device_list(&n);
	for (int i = 0; devs && i < n; i++) {
		struct ibv_context *ctx = ibv_open_device(devs[i]);
		struct ibv_port_attr port;
		union ibv_gid gid;
		if (!ctx)
			continue;
		if (!ibv_query_port(ctx, 1, &port) && port.link_layer == IBV_LINK_LAYER_ETHERNET &&
		    !ibv_query_gid(ctx, 1, 3, &gid))
			printf("GID %s %u.%u.%u.%u\n", ibv_get_device_name(devs[i]), gid.raw[12],
			       gid.raw[13], gid.raw[14], gid.raw[15]);
		ibv_close_device(ctx);
	}
	if (devs)
		ibv_free_device_list(devs);

	for (int i = 0; i < 1000; i++) {
		if (getifaddrs(&list)) {
			perror("getifaddrs");
			return 1;
		}
		freeifaddrs(list);
	}
	puts("done");
	return 0;
}
