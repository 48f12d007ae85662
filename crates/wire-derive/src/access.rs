//! `#[derive(Access)]`: what a request is to admission, declared on its variant
//! (`weft_proto::access`).
//!
//! Every variant carries `#[access(...)]`, and a variant without one does not compile:
//! - its kind: `reads` (a client may send it, read-only clients too), `changes` (a client may
//!   send it; it changes files, directories or attributes), `members` (only the cluster's
//!   members may), or `kind = EXPR` over the variant's fields (bound by reference);
//! - `inodes(FIELD, ...)`: the inodes it names, each of which must lie in a confined client's
//!   subtree (fields of type `InodeId`);
//! - `sessions(FIELD, ...)`: the client sessions it acts in (fields whose type implements
//!   `weft_proto::access::ActsIn`: a mutation id, a session id, a capability).
//!
//! The derive gives the enum `kind(&self)`, `inodes_named(&self)` and `sessions(&self)`.

use proc_macro2::TokenStream as Tokens;
use quote::quote;
use syn::{Data, DeriveInput, Fields, Ident};

/// One variant's declaration.
struct Declared<'a> {
    ident: &'a Ident,
    fields: &'a Fields,
    kind: Tokens,
    inodes: Vec<Ident>,
    sessions: Vec<Ident>,
}

pub(crate) fn expand(input: &DeriveInput) -> syn::Result<Tokens> {
    let Data::Enum(data) = &input.data else {
        return Err(syn::Error::new_spanned(
            input,
            "#[derive(Access)] is for request enums",
        ));
    };
    let mut declared = Vec::new();
    for variant in &data.variants {
        declared.push(declaration(variant)?);
    }
    let ty = &input.ident;
    let kind_arms = declared.iter().map(|d| {
        let pattern = pattern(ty, d, d.fields.iter().filter_map(|f| f.ident.as_ref()));
        let kind = &d.kind;
        quote!(#pattern => #kind,)
    });
    let inode_arms = declared.iter().map(|d| {
        let pattern = pattern(ty, d, d.inodes.iter());
        let inodes = &d.inodes;
        quote!(#pattern => ::std::vec![#(*#inodes),*],)
    });
    let session_arms = declared.iter().map(|d| {
        let pattern = pattern(ty, d, d.sessions.iter());
        let sessions = &d.sessions;
        quote!(#pattern => {
            let mut sessions = ::std::vec::Vec::new();
            #(crate::access::ActsIn::acts_in(#sessions, &mut sessions);)*
            sessions
        })
    });
    Ok(quote! {
        #[allow(dead_code)]
        impl #ty {
            /// What it is to admission: read, change, or for members (its declaration).
            #[allow(unused_variables)]
            pub(crate) fn kind(&self) -> crate::access::Kind {
                match self {
                    #(#kind_arms)*
                }
            }

            /// The inodes it names, each of which must lie in a confined client's subtree
            /// (its declaration).
            pub fn inodes_named(&self) -> ::std::vec::Vec<crate::ids::InodeId> {
                match self {
                    #(#inode_arms)*
                }
            }

            /// The client sessions it acts in: whose replies, opens, locks or changes it
            /// touches (its declaration).
            pub(crate) fn sessions(&self) -> ::std::vec::Vec<crate::ids::ClientId> {
                match self {
                    #(#session_arms)*
                }
            }
        }
    })
}

/// The pattern of `declared`'s variant binding `bound` of its fields.
fn pattern<'a>(
    ty: &Ident,
    declared: &Declared<'_>,
    bound: impl Iterator<Item = &'a Ident>,
) -> Tokens {
    let ident = declared.ident;
    match declared.fields {
        Fields::Named(_) => {
            let bound: Vec<&Ident> = bound.collect();
            quote!(#ty::#ident { #(#bound,)* .. })
        }
        Fields::Unnamed(_) => quote!(#ty::#ident(..)),
        Fields::Unit => quote!(#ty::#ident),
    }
}

fn declaration(variant: &syn::Variant) -> syn::Result<Declared<'_>> {
    let mut kind = None;
    let mut inodes = Vec::new();
    let mut sessions = Vec::new();
    let mut found = false;
    for attr in variant.attrs.iter().filter(|a| a.path().is_ident("access")) {
        found = true;
        attr.parse_nested_meta(|meta| {
            let named = |list: &mut Vec<Ident>| {
                meta.parse_nested_meta(|field| {
                    let ident = field
                        .path
                        .get_ident()
                        .ok_or_else(|| field.error("a field of the variant"))?;
                    list.push(ident.clone());
                    Ok(())
                })
            };
            if meta.path.is_ident("reads") {
                kind = Some(quote!(crate::access::Kind::Reads));
            } else if meta.path.is_ident("changes") {
                kind = Some(quote!(crate::access::Kind::Changes));
            } else if meta.path.is_ident("members") {
                kind = Some(quote!(crate::access::Kind::Members));
            } else if meta.path.is_ident("kind") {
                let expr: syn::Expr = meta.value()?.parse()?;
                kind = Some(quote!(#expr));
            } else if meta.path.is_ident("inodes") {
                named(&mut inodes)?;
            } else if meta.path.is_ident("sessions") {
                named(&mut sessions)?;
            } else {
                return Err(meta.error(
                    "expected reads, changes, members, kind = EXPR, inodes(..) or sessions(..)",
                ));
            }
            Ok(())
        })?;
    }
    if !found {
        return Err(syn::Error::new_spanned(
            &variant.ident,
            "every request declares its access: #[access(reads | changes | members, ...)]",
        ));
    }
    let kind = kind.ok_or_else(|| {
        syn::Error::new_spanned(
            &variant.ident,
            "#[access(...)] names the request's kind: reads, changes, members or kind = EXPR",
        )
    })?;
    let names_fields = !inodes.is_empty() || !sessions.is_empty();
    if names_fields && !matches!(variant.fields, Fields::Named(_)) {
        return Err(syn::Error::new_spanned(
            &variant.ident,
            "inodes(..) and sessions(..) name fields of a variant with named fields",
        ));
    }
    Ok(Declared {
        ident: &variant.ident,
        fields: &variant.fields,
        kind,
        inodes,
        sessions,
    })
}
