//! `#[derive(Module)]`: a struct's fields become the module's children, parameters and buffers
//! by name, so that a module cannot forget one (a hand-written `Module::visit` that leaves a
//! layer out leaves it untrained and unsaved without a word).
//!
//! The struct writes its forward pass as an inherent method `fn forward<'g>(&self, g: &'g
//! Graph, x: Tensor<'g>) -> Result<Tensor<'g>>` (or names another with
//! `#[module(forward = "Self::run")]`); the derive implements `Module` around it:
//!
//! - `visit` hands each field over under its name, in declaration order: a `Parameter` as a
//!   parameter (a buffer with `#[module(buffer)]`), any other type as a child module;
//!   `Option<_>` when `Some`, `Vec<_>`, arrays and boxed slices element by element (named
//!   `field.0`, `field.1`, …, as PyTorch's `ModuleList`); `#[module(rename = "LayerNorm")]`
//!   gives another name, `#[module(skip)]` leaves a field out, and plain values (numbers,
//!   `bool`, `String`, `DType`, `PhantomData`) are left out without one;
//! - `set_training` reaches every child, and sets a `training: bool` field (or one marked
//!   `#[module(training)]`).
//!
//! A struct without the forward method is a compile error naming what is missing, not a
//! module that calls itself. See `arenagrad_nn::Module` for an example.

#![forbid(unsafe_code)]

use proc_macro::TokenStream;
use proc_macro2::{Span, TokenStream as Tokens};
use quote::{format_ident, quote};
use syn::{
    parse_macro_input, spanned::Spanned, Data, DeriveInput, Error, Fields, GenericArgument, LitStr,
    PathArguments, Type,
};

/// Implements `Module` for a struct from its fields (see the crate documentation).
#[proc_macro_derive(Module, attributes(module))]
pub fn derive_module(input: TokenStream) -> TokenStream {
    let input = parse_macro_input!(input as DeriveInput);
    match expand(&input) {
        Ok(t) => t.into(),
        Err(e) => e.to_compile_error().into(),
    }
}

/// What a field is to the module.
enum Role {
    Skip,
    Training,
    Value { buffer: bool },
    Child,
}

/// How a field holds its value(s).
enum Holder {
    One,
    Optional,
    Many,
}

struct FieldPlan {
    access: Tokens,
    name: String,
    role: Role,
    holder: Holder,
}

/// The struct-level options: the crate path and the forward method.
struct Options {
    krate: Option<syn::Path>,
    forward: Option<syn::ExprPath>,
}

fn expand(input: &DeriveInput) -> syn::Result<Tokens> {
    let Data::Struct(data) = &input.data else {
        return Err(Error::new(
            input.ident.span(),
            "#[derive(Module)] takes a struct (its fields are the module's parts)",
        ));
    };
    let opts = struct_options(input)?;
    let krate = match opts.krate {
        Some(p) => quote!(#p),
        None => crate_path(),
    };
    let mut plans = Vec::new();
    match &data.fields {
        Fields::Named(f) => {
            for field in &f.named {
                let ident = field.ident.as_ref().expect("invariant: named field");
                plans.push(plan(
                    field,
                    quote!(#ident),
                    ident.to_string().trim_start_matches("r#").to_string(),
                )?);
            }
        }
        Fields::Unnamed(f) => {
            for (i, field) in f.unnamed.iter().enumerate() {
                let index = syn::Index::from(i);
                plans.push(plan(field, quote!(#index), i.to_string())?);
            }
        }
        Fields::Unit => {}
    }
    let mut visits = Vec::new();
    let mut trainings = Vec::new();
    for p in &plans {
        let access = &p.access;
        let name = &p.name;
        match p.role {
            Role::Skip => {}
            Role::Training => trainings.push(quote!(self.#access = training;)),
            Role::Value { buffer } => {
                let call = if buffer {
                    format_ident!("buffer")
                } else {
                    format_ident!("param")
                };
                visits.push(match p.holder {
                    Holder::One => quote!(v.#call(#name, &self.#access);),
                    Holder::Optional => quote! {
                        if let ::core::option::Option::Some(x) = &self.#access {
                            v.#call(#name, x);
                        }
                    },
                    Holder::Many => quote! {
                        for (i, x) in self.#access.iter().enumerate() {
                            v.#call(&::std::format!("{}.{}", #name, i), x);
                        }
                    },
                });
            }
            Role::Child => {
                let (visit, train) = match p.holder {
                    Holder::One => (
                        quote!(v.child(#name, &self.#access);),
                        quote!(#krate::Module::set_training(&mut self.#access, training);),
                    ),
                    Holder::Optional => (
                        quote! {
                            if let ::core::option::Option::Some(x) = &self.#access {
                                v.child(#name, x);
                            }
                        },
                        quote! {
                            if let ::core::option::Option::Some(x) = &mut self.#access {
                                #krate::Module::set_training(x, training);
                            }
                        },
                    ),
                    Holder::Many => (
                        quote! {
                            for (i, x) in self.#access.iter().enumerate() {
                                v.child(&::std::format!("{}.{}", #name, i), x);
                            }
                        },
                        quote! {
                            for x in self.#access.iter_mut() {
                                #krate::Module::set_training(x, training);
                            }
                        },
                    ),
                };
                visits.push(visit);
                trainings.push(train);
            }
        }
    }
    let ident = &input.ident;
    let (impl_generics, ty_generics, where_clause) = input.generics.split_for_impl();
    let forward = match opts.forward {
        Some(path) => quote!(#path(self, g, x)),
        None => quote! {{
            // Without an inherent `forward`, this trait's method and `Module::forward` would
            // both apply: a compile error that names what is missing, instead of a forward
            // that calls itself.
            #[allow(dead_code)]
            trait DeriveModuleNeedsAnInherentForwardMethodOrModuleForwardAttribute {
                fn forward(&self) {}
            }
            impl<T: ?Sized> DeriveModuleNeedsAnInherentForwardMethodOrModuleForwardAttribute for T {}
            Self::forward(self, g, x)
        }},
    };
    Ok(quote! {
        impl #impl_generics #krate::Module for #ident #ty_generics #where_clause {
            fn forward<'g>(
                &self,
                g: &'g #krate::Graph,
                x: #krate::Tensor<'g>,
            ) -> #krate::Result<#krate::Tensor<'g>> {
                #forward
            }

            fn visit(&self, v: &mut #krate::Visitor<'_>) {
                let _ = &v;
                #(#visits)*
            }

            fn set_training(&mut self, training: bool) {
                let _ = training;
                #(#trainings)*
            }
        }
    })
}

/// `::arenagrad_nn` when the deriving crate depends on `arenagrad-nn`, `::arenagrad::nn` when
/// on the `arenagrad` umbrella crate (found in its `Cargo.toml`).
fn crate_path() -> Tokens {
    use proc_macro_crate::{crate_name, FoundCrate};
    match crate_name("arenagrad-nn") {
        // Within arenagrad-nn, whose `extern crate self as arenagrad_nn` makes the name work in
        // the library itself as in its tests and doctests.
        Ok(FoundCrate::Itself) => return quote!(::arenagrad_nn),
        Ok(FoundCrate::Name(n)) => {
            let n = syn::Ident::new(&n, Span::call_site());
            return quote!(::#n);
        }
        Err(_) => {}
    }
    match crate_name("arenagrad") {
        Ok(FoundCrate::Name(n)) => {
            let n = syn::Ident::new(&n, Span::call_site());
            quote!(::#n::nn)
        }
        Ok(FoundCrate::Itself) => quote!(::arenagrad::nn),
        Err(_) => quote!(::arenagrad_nn),
    }
}

fn struct_options(input: &DeriveInput) -> syn::Result<Options> {
    let mut opts = Options {
        krate: None,
        forward: None,
    };
    for attr in input.attrs.iter().filter(|a| a.path().is_ident("module")) {
        attr.parse_nested_meta(|m| {
            if m.path.is_ident("crate") {
                let s: LitStr = m.value()?.parse()?;
                opts.krate = Some(s.parse()?);
                Ok(())
            } else if m.path.is_ident("forward") {
                let s: LitStr = m.value()?.parse()?;
                opts.forward = Some(s.parse()?);
                Ok(())
            } else {
                Err(m.error(
                    "unknown option: a struct takes #[module(forward = \"path\")] and \
                     #[module(crate = \"path\")]",
                ))
            }
        })?;
    }
    Ok(opts)
}

fn plan(field: &syn::Field, access: Tokens, default_name: String) -> syn::Result<FieldPlan> {
    let (mut skip, mut buffer, mut training, mut param) = (false, false, false, false);
    let mut name = default_name;
    for attr in field.attrs.iter().filter(|a| a.path().is_ident("module")) {
        attr.parse_nested_meta(|m| {
            if m.path.is_ident("skip") {
                skip = true;
            } else if m.path.is_ident("buffer") {
                buffer = true;
            } else if m.path.is_ident("param") {
                param = true;
            } else if m.path.is_ident("training") {
                training = true;
            } else if m.path.is_ident("rename") {
                let s: LitStr = m.value()?.parse()?;
                name = s.value();
            } else {
                return Err(m.error(
                    "unknown option: a field takes skip, param, buffer, training and \
                     rename = \"name\"",
                ));
            }
            Ok(())
        })?;
    }
    if skip {
        return Ok(FieldPlan {
            access,
            name,
            role: Role::Skip,
            holder: Holder::One,
        });
    }
    let (holder, inner) = holder_of(&field.ty);
    let leaf = last_ident(inner);
    let is_parameter = leaf.as_deref() == Some("Parameter");
    let named_training = name == "training" && leaf.as_deref() == Some("bool");
    let role = if training || named_training {
        if leaf.as_deref() != Some("bool") {
            return Err(Error::new(
                field.ty.span(),
                "#[module(training)] marks a bool field",
            ));
        }
        Role::Training
    } else if is_parameter || param || buffer {
        Role::Value { buffer }
    } else if leaf.as_deref().is_some_and(is_plain_value) {
        Role::Skip
    } else {
        Role::Child
    };
    Ok(FieldPlan {
        access,
        name,
        role,
        holder,
    })
}

/// Whether a type of this name is a plain value, not a module.
fn is_plain_value(name: &str) -> bool {
    matches!(
        name,
        "bool"
            | "char"
            | "f32"
            | "f64"
            | "u8"
            | "u16"
            | "u32"
            | "u64"
            | "u128"
            | "usize"
            | "i8"
            | "i16"
            | "i32"
            | "i64"
            | "i128"
            | "isize"
            | "String"
            | "str"
            | "DType"
            | "Device"
            | "PhantomData"
    )
}

/// How `ty` holds its values (`Option`, a list, or itself) and the type of one.
fn holder_of(ty: &Type) -> (Holder, &Type) {
    match ty {
        Type::Array(a) => (Holder::Many, &a.elem),
        Type::Path(p) => {
            let Some(seg) = p.path.segments.last() else {
                return (Holder::One, ty);
            };
            let arg = match &seg.arguments {
                PathArguments::AngleBracketed(a) => a.args.iter().find_map(|a| match a {
                    GenericArgument::Type(t) => Some(t),
                    _ => None,
                }),
                _ => None,
            };
            match (seg.ident.to_string().as_str(), arg) {
                ("Option", Some(t)) => (Holder::Optional, t),
                ("Vec", Some(t)) => (Holder::Many, t),
                ("Box", Some(Type::Slice(s))) => (Holder::Many, &s.elem),
                _ => (Holder::One, ty),
            }
        }
        _ => (Holder::One, ty),
    }
}

/// The last path segment's name of `ty` (`Parameter` for `arenagrad::Parameter`).
fn last_ident(ty: &Type) -> Option<String> {
    match ty {
        Type::Path(p) => p.path.segments.last().map(|s| s.ident.to_string()),
        _ => None,
    }
}
