// SPDX-License-Identifier: (MIT OR GPL-2.0)
// The Laminar XDP router: tells membership (SWIM gossip) datagrams apart from partition (API)
// and replication (peer) traffic before it reaches user space, drops gossip datagrams that are
// not Laminar's or not this cluster's, and counts packets, bytes and drops per class.
//
//   Ethernet -> up to two VLAN tags -> IPv4 | IPv6 -> UDP | TCP
//
// Classes (the index of the `counters` map):
//   0 other       everything else (passed)
//   1 membership  UDP to the gossip port; dropped unless the payload starts with the Laminar
//                 gossip header: magic "LMQG" at offset 0 and xxh64(cluster id), u64
//                 little-endian, at offset 8 (docs/formats.md §5)
//   2 api         TCP to the API port (partition reads, appends, queues, admin)
//   3 peer        TCP to the peer (replication) port
//
// The loader (`laminar-xdp`, laminar/xdp.py) writes the ports and the cluster hash into the
// `config` map, so one object file serves every cluster. Until it has, every packet passes as
// "other". Non-first IPv4 fragments and IPv6 packets with extension headers carry no transport
// header at a known place: they pass as "other".
#include <linux/bpf.h>
#include <linux/if_ether.h>
#include <linux/in.h>
#include <linux/ip.h>
#include <linux/ipv6.h>
#include <linux/tcp.h>
#include <linux/udp.h>
#include <bpf/bpf_endian.h>
#include <bpf/bpf_helpers.h>

#define CLASS_OTHER 0
#define CLASS_MEMBERSHIP 1
#define CLASS_API 2
#define CLASS_PEER 3
#define CLASS_COUNT 4

#define MAX_VLAN_TAGS 2
#define GOSSIP_HEADER_BYTES 16
#define IPV4_FRAGMENT_OFFSET_MASK 0x1fff

// Written by the loader; ports in host byte order. Layout fixed (laminar/xdp.py packs it).
struct laminar_config {
	__u16 gossip_port;
	__u16 api_port;
	__u16 peer_port;
	__u16 reserved;
	__u64 cluster_hash;
};

struct class_counters {
	__u64 packets;
	__u64 bytes;
	__u64 drops;
};

struct vlan_header {
	__be16 tci;
	__be16 encapsulated_proto;
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct laminar_config);
} config SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, CLASS_COUNT);
	__type(key, __u32);
	__type(value, struct class_counters);
} counters SEC(".maps");

static __always_inline int account(__u32 class, __u64 bytes, int verdict)
{
	struct class_counters *counter = bpf_map_lookup_elem(&counters, &class);

	if (counter) {
		counter->packets += 1;
		counter->bytes += bytes;
		if (verdict == XDP_DROP)
			counter->drops += 1;
	}
	return verdict;
}

// A gossip datagram of ours: Laminar's magic and this cluster's hash at their fixed offsets.
static __always_inline int gossip_verdict(const __u8 *payload, const void *end,
					  const struct laminar_config *cfg)
{
	__u64 hash = 0;

	if ((const void *)(payload + GOSSIP_HEADER_BYTES) > end)
		return XDP_DROP;
	if (payload[0] != 'L' || payload[1] != 'M' || payload[2] != 'Q' || payload[3] != 'G')
		return XDP_DROP;
#pragma unroll
	for (int i = 7; i >= 0; i--)
		hash = (hash << 8) | payload[8 + i];
	return hash == cfg->cluster_hash ? XDP_PASS : XDP_DROP;
}

SEC("xdp")
int laminar_router(struct xdp_md *ctx)
{
	const void *data = (const void *)(long)ctx->data;
	const void *end = (const void *)(long)ctx->data_end;
	__u64 bytes = (__u64)(end - data);
	__u32 zero = 0;
	const struct laminar_config *cfg = bpf_map_lookup_elem(&config, &zero);
	const struct ethhdr *eth = data;
	const void *cursor;
	__u16 proto;
	__u8 l4;

	if (!cfg || cfg->gossip_port == 0)
		return account(CLASS_OTHER, bytes, XDP_PASS);
	if ((const void *)(eth + 1) > end)
		return account(CLASS_OTHER, bytes, XDP_PASS);
	proto = eth->h_proto;
	cursor = eth + 1;
#pragma unroll
	for (int i = 0; i < MAX_VLAN_TAGS; i++) {
		const struct vlan_header *vlan = cursor;

		if (proto != bpf_htons(ETH_P_8021Q) && proto != bpf_htons(ETH_P_8021AD))
			break;
		if ((const void *)(vlan + 1) > end)
			return account(CLASS_OTHER, bytes, XDP_PASS);
		proto = vlan->encapsulated_proto;
		cursor = vlan + 1;
	}

	if (proto == bpf_htons(ETH_P_IP)) {
		const struct iphdr *ip = cursor;

		if ((const void *)(ip + 1) > end || ip->ihl < 5)
			return account(CLASS_OTHER, bytes, XDP_PASS);
		if (ip->frag_off & bpf_htons(IPV4_FRAGMENT_OFFSET_MASK))
			return account(CLASS_OTHER, bytes, XDP_PASS);
		l4 = ip->protocol;
		cursor = (const __u8 *)ip + ip->ihl * 4;
	} else if (proto == bpf_htons(ETH_P_IPV6)) {
		const struct ipv6hdr *ip6 = cursor;

		if ((const void *)(ip6 + 1) > end)
			return account(CLASS_OTHER, bytes, XDP_PASS);
		l4 = ip6->nexthdr;
		cursor = ip6 + 1;
	} else {
		return account(CLASS_OTHER, bytes, XDP_PASS);
	}

	if (l4 == IPPROTO_UDP) {
		const struct udphdr *udp = cursor;

		if ((const void *)(udp + 1) > end)
			return account(CLASS_OTHER, bytes, XDP_PASS);
		if (bpf_ntohs(udp->dest) == cfg->gossip_port)
			return account(CLASS_MEMBERSHIP, bytes,
				       gossip_verdict((const __u8 *)(udp + 1), end, cfg));
	} else if (l4 == IPPROTO_TCP) {
		const struct tcphdr *tcp = cursor;
		__u16 port;

		if ((const void *)(tcp + 1) > end)
			return account(CLASS_OTHER, bytes, XDP_PASS);
		port = bpf_ntohs(tcp->dest);
		if (port == cfg->api_port)
			return account(CLASS_API, bytes, XDP_PASS);
		if (port == cfg->peer_port)
			return account(CLASS_PEER, bytes, XDP_PASS);
	}
	return account(CLASS_OTHER, bytes, XDP_PASS);
}

char LICENSE[] SEC("license") = "Dual MIT/GPL";
