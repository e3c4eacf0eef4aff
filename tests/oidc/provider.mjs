// A real OpenID Connect provider for Trainyard's sign-in tests: the certified `oidc-provider`
// package with its development login and consent pages (any password), the device flow,
// revocation and refresh tokens. Everything the tests vary comes in $OIDC_CONFIG (JSON):
//   port, issuer, keys (a private JWKS: the tests rotate keys by restarting with another),
//   clients (client metadata), accounts_file (a JSON file: {login: {groups, email}}),
//   ttl ({AccessToken: s, ...}),
//   device_flow (false: a provider without one, as some are)
// It prints "listening" once it answers, and stops on SIGTERM.
import { readFileSync } from "node:fs";
import Provider from "oidc-provider";

const config = JSON.parse(process.env.OIDC_CONFIG);
// Read at every sign-in and refresh: a test changes a person's groups in the file meanwhile.
const accounts = () => JSON.parse(readFileSync(config.accounts_file, "utf8"));
const ttl = config.ttl || {};

const provider = new Provider(config.issuer, {
  clients: config.clients,
  jwks: config.keys,
  // Groups and e-mail in the ID token itself, as most providers configure it for an app.
  conformIdTokenClaims: false,
  claims: { openid: ["sub"], email: ["email"], groups: ["groups"] },
  scopes: ["openid", "offline_access", "email", "groups"],
  features: {
    devInteractions: { enabled: true },
    deviceFlow: { enabled: config.device_flow !== false },
    revocation: { enabled: true },
    introspection: { enabled: true },
  },
  // A refresh token whenever the client may use one: Trainyard checks a session with it.
  issueRefreshToken: async (_ctx, client) => client.grantTypeAllowed("refresh_token"),
  ttl: {
    AccessToken: ttl.AccessToken || 3600,
    AuthorizationCode: 60,
    DeviceCode: 600,
    IdToken: ttl.IdToken || 3600,
    RefreshToken: ttl.RefreshToken || 86400,
    Interaction: 600,
    Session: 86400,
    Grant: ttl.Grant || 86400,
  },
  async findAccount(_ctx, id) {
    // Any login signs in (the development pages take any password); its claims come from
    // `accounts`, and an unknown login is a person in no group.
    const known = accounts()[id] || { groups: [] };
    return {
      accountId: id,
      async claims() {
        return { sub: id, email: known.email || `${id}@example.test`, groups: known.groups };
      },
    };
  },
});
// Plain HTTP on the loopback address: the package allows it outside production.
provider.proxy = false;

const server = provider.listen(config.port, "127.0.0.1", () => {
  console.log("listening");
});
process.on("SIGTERM", () => server.close(() => process.exit(0)));
