// Preloaded into kinesis-mock (`node --require`): kinesis-mock always listens on
// every interface (its host is hard-coded to 0.0.0.0), and an unauthenticated
// emulator has no business on the LAN. This rewrites wildcard listens to the
// address in KCL_BIND_HOST (default 127.0.0.1). Outbound sockets are untouched.
'use strict';
const net = require('net');

const host = process.env.KCL_BIND_HOST || '127.0.0.1';
const wildcard = new Set([undefined, null, '', '0.0.0.0', '::']);
const listen = net.Server.prototype.listen;

net.Server.prototype.listen = function (...args) {
  const [first, second] = args;
  if (typeof first === 'number' || (typeof first === 'string' && /^\d+$/.test(first))) {
    // listen(port[, host][, backlog][, cb])
    if (typeof second === 'string' || second === undefined || second === null) {
      if (wildcard.has(second)) args[1] = host;
    } else {
      args.splice(1, 0, host);
    }
  } else if (first !== null && typeof first === 'object' && first.path === undefined
             && first.fd === undefined && first._handle === undefined && first.handle === undefined) {
    // listen({ port, host, ... }[, cb])
    if (wildcard.has(first.host)) args[0] = { ...first, host };
  }
  return listen.apply(this, args);
};
